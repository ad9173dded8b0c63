"""parlab.comm: watch every collective and point-to-point call a rank makes, and count its bytes.

Inside a rank (for instance in a function given to `parlab.launch.run`):

    from parlab import comm
    with comm.trace() as tr:
        dist.all_reduce(x)                 # x: (1024,) float32 = 4096 bytes
    tr.events[0].kind                      # "all_reduce"
    tr.wire_bytes()                        # 2(t-1)/t * 4096 under a ring algorithm

How it works: `install()` replaces the functions of `torch.distributed` (all_reduce,
all_gather, send, isend, ...) with thin wrappers that tell every registered listener when a
call starts and ends. The tracer is one listener; the launcher registers another that keeps
a one-line status per rank, so a hang can say what each rank was doing.

Seen: `dist.isend(...)`, and a name imported from torch.distributed while the tracer is
installed; a rank of `parlab.launch.run` installs it before it unpickles the function, so a
notebook cell's `from torch.distributed import isend` is seen there (cloudpickle ships it by
name). Not seen: a name bound before `install()` ran in its process (tests/test_comm.py).

Wire bytes are the bytes a rank sends under the ring algorithms of `parlab.costs`
(`parlab.comm.bytes`): all_reduce 2(t-1)/t*n, all_gather and reduce_scatter (t-1)/t*n of the
full tensor, all_to_all (t-1)/t*n of the input, send n, recv 0.

- `tracer`: the wrappers, the listeners and `trace()`;
- `bytes`: a call's payload and its wire bytes under the ring algorithms;
- `staging`: CUDA tensors through the host where gloo cannot take them (`PARLAB_ONE_GPU`).
"""

from parlab.comm.tracer import (
    Event,
    Listener,
    Trace,
    add_listener,
    install,
    posted,
    posted_key,
    remove_listener,
    route_p2p,
    trace,
)

__all__ = ["Event", "Listener", "Trace", "add_listener", "install", "posted", "posted_key",
           "remove_listener", "route_p2p", "trace"]
