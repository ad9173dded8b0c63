"""Commands for the hub's GPU allotment (the state file of `parlab.hub.allot`).

    python -m parlab.hub gpus  [--state autograder/hub/run/gpus.json]   # who holds which GPUs
    python -m parlab.hub free NAME [--state ...]             # give NAME's GPUs back by hand
    python -m parlab.hub watch [--every 60]                  # the hub's gpu-pool service
    python -m parlab.hub exchange     # as root: nbgrader's exchange made private (make hub-*)

`watch` runs as a JupyterHub service (autograder/hub/jupyterhub_config.py): every `--every`
seconds it asks the hub's REST API which servers are active (running or starting) and returns
to the pool the GPUs of any other holder: a server that died while the hub was down, or one whose
stop hook never ran. The hub stops it with itself; should the hub die first, it ends too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterable
from typing import Any

from parlab.hub.allot import Allotment
from parlab.hub.exchange import ExchangeProblem, exchange_settings, prepare_exchange

DEFAULT_STATE = os.environ.get("PARLAB_HUB_STATE", "autograder/hub/run/gpus.json")


def active_servers(users: Iterable[dict[str, Any]]) -> list[str]:
    """The allotment's keys (user, or user/server) of every server the hub lists as active."""
    keys = []
    for user in users:
        for name in (user.get("servers") or {}):
            keys.append(user["name"] + (f"/{name}" if name else ""))
    return keys


def _hub_users() -> list[dict[str, Any]]:
    """Every user with an active server, from the hub's REST API (the service's token)."""
    api = os.environ["JUPYTERHUB_API_URL"].rstrip("/")
    headers = {"Authorization": f"token {os.environ['JUPYTERHUB_API_TOKEN']}",
               "Accept": "application/jupyterhub-pagination+json"}
    users: list[dict[str, Any]] = []
    offset = 0
    while True:
        url = f"{api}/users?state=active&offset={offset}&limit=200"
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as reply:
            page = json.load(reply)
        users += page["items"]
        following = (page.get("_pagination") or {}).get("next")
        if not following:
            return users
        offset = following["offset"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parlab.hub", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["gpus", "free", "watch", "exchange"])
    parser.add_argument("name", nargs="?", help="free: whose GPUs to give back")
    parser.add_argument("--state", default=DEFAULT_STATE, help="the allotment's JSON file")
    parser.add_argument("--every", type=float, default=60.0, help="watch: seconds between looks")
    args = parser.parse_args(argv)
    if args.command == "exchange":
        return _exchange()
    pool = Allotment.from_file(args.state)
    if args.command == "gpus":
        print(pool.table() if pool.plan.gpus else f"no GPU plan in {args.state} (no hub yet, "
              "or a hub without GPUs)")
    elif args.command == "free":
        if not args.name:
            parser.error("free needs the NAME whose GPUs to give back")
        print(f"{args.name} gave back GPUs {pool.give_back(args.name)}")
    else:
        watch(pool, every=args.every)
    return 0


def _exchange() -> int:
    """Make (as root) nbgrader's exchange with the hub's modes, before the make targets that
    release, collect and return through it; say where it is."""
    root, course = exchange_settings()
    try:
        prepare_exchange(root, course)
    except ExchangeProblem as exc:
        print(f"nbgrader's exchange: {exc}", file=sys.stderr)
        return 2
    print(f"nbgrader's exchange: {root}, course {course}")
    return 0


def watch(pool: Allotment, *, every: float) -> None:
    """The gpu-pool service's loop; it ends when the hub that started it has gone."""
    hub = os.getppid()
    while os.getppid() == hub:
        try:
            users = _hub_users()
        except OSError as err:  # the hub restarting, or busy: look again later
            print(f"gpu-pool: the hub's API did not answer ({err})", file=sys.stderr, flush=True)
            users = None
        for who, gpus in ({} if users is None else pool.reconcile(active_servers(users))).items():
            print(f"gpu-pool: {who} holds no running server; GPUs {gpus} back in the pool",
                  file=sys.stderr, flush=True)
        deadline = time.monotonic() + every
        while os.getppid() == hub and time.monotonic() < deadline:
            time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
