"""Graded checks of module 00, "Collectives and the interconnect".

- `ring`: exercise 1, `check_ring_allreduce(ring_allreduce, world_size=t)`: a ring all-reduce
  from send/recv against the sum of the ranks' inputs, with its traffic traced.
- `story`: the check's inputs and what a wrong output tells about the mistake.
- `intensity`: exercise 2, `check_intensities(tp_intensity, dp_intensity, link_requirement)`
  and `check_placement(placement)`: FLOPs per byte against a link, parlab.costs refused.
- `mesh`: exercise 3, `check_device_mesh(make_device_mesh)`: PyTorch's DeviceMesh against the
  course's grid torch.arange(world).view(dp, pp, cp, tp), rank for rank.

    from parlab.check.collectives import check_ring_allreduce
"""

from parlab.check.collectives.intensity import check_intensities, check_placement
from parlab.check.collectives.mesh import check_device_mesh
from parlab.check.collectives.ring import check_ring_allreduce
from parlab.check.collectives.story import INPUTS, decode, expected_sum, make_input
from parlab.errors import CheckFailed

__all__ = ["check_ring_allreduce", "check_intensities", "check_placement", "check_device_mesh",
           "make_input",
           "expected_sum", "decode", "INPUTS", "CheckFailed"]
