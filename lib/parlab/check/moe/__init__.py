"""Graded checks of module 06, "Expert parallelism"; the notebook calls them as
`from parlab.check import moe as moecheck; moecheck.check_router(router)`.

- `router`: exercise 1 (`check_router`) and exercise 2 (`check_capacity`, with the worked
  example `WORKED` / `WORKED_KEEP` the notebook shows), in this process.
- `ep`: exercises 3 and 4 (`check_ep_moe`, `check_ep_capacity`) on ep ranks.
- `watch`: what the dispatch checks watch in a rank (dtypes and split sizes of every
  all_to_all_single).
- `common`: the references an answer may not use (parlab.moe), tolerances, hints.
"""

from parlab.check.moe.ep import check_ep_capacity, check_ep_moe
from parlab.check.moe.router import WORKED, WORKED_KEEP, check_capacity, check_router
from parlab.errors import CheckFailed

__all__ = ["check_router", "check_capacity", "check_ep_moe", "check_ep_capacity", "WORKED",
           "WORKED_KEEP", "CheckFailed"]
