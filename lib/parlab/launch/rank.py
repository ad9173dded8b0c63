"""The life of one rank started by `parlab.launch.run` (runs in the child process).

1. Watch the parent: a thread reads the lifeline pipe and ends this process when the parent
   closes it (run is over) or dies (a killed kernel leaves no orphans).
2. Join the default process group through a file store (no port to pick, so concurrent runs
   cannot collide) with TORCH_DISTRIBUTED_DEBUG=DETAIL, which makes ranks that call
   mismatched collectives fail at once instead of exchanging wrong data. Under NCCL: this
   rank's GPU (the caller's `parlab.launch.devices.gpus`), blocking waits (a NCCL deadlock
   then ends in the launcher's timeout, seen as a wait, like gloo's); TF32 off everywhere.
3. Publish a one-line status (what this rank is doing) in shared memory at every
   communication call, so a hang can be explained by the parent.
4. Run the user's function and send back ("ok", result, calls) or ("error", details): tensors
   on the CPU (the caller's kernel holds no CUDA context for them), and with
   PARLAB_NCCL_RULES=1 its point-to-point calls (parlab.launch.nccl_rules).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from parlab import comm, timeline
from parlab.comm import staging as comm_staging
from parlab.launch import devices, nccl_rules

STATUS_BYTES = 1024  # room for one JSON status line per rank


def _publish(status: Any, record: dict[str, Any]) -> None:
    data = json.dumps(record).encode()[: STATUS_BYTES - 1]
    status[: len(data) + 1] = data + b"\0"


def _status_listener(status: Any):
    calls = [0]

    def listener(phase: str, event: comm.Event) -> None:
        if phase == "start":
            calls[0] += 1
        _publish(status, {
            "state": "in" if phase == "start" else "after",
            "what": event.describe(), "kind": event.kind,
            "group": list(range(dist.get_world_size())) if event.kind == "new_group"
            else list(event.group_ranks), "p2p": event.group_size == 2 and
            event.kind.replace("wait(", "").rstrip(")") in ("send", "recv", "isend", "irecv"),
            "call": calls[0], "seq": event.seq, "posted": comm.posted(), "t": time.time(),
            **({"members": list(event.group_ranks)} if event.kind == "new_group" else {}),
        })

    return listener


class _CpuPickler(pickle.Pickler):
    """Pickles a result with every tensor on the CPU."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            return obj.cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return NotImplemented


def on_cpu(obj: Any) -> bytes:
    """`obj` pickled with its tensors on the CPU, wherever it holds them."""
    buf = io.BytesIO()
    _CpuPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _watch_parent(lifeline: Any) -> None:
    try:
        lifeline.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(0)


def take_gpu(gpu: int | None, *, nccl: bool) -> None:
    """Make `gpu` (None: none) this rank's device. Under NCCL, NCCL's waits block: its own
    `wait()` returns once the work is queued, so a deadlocked rank would look busy in its own
    code; blocking, it sits inside the call that never completes, as on gloo, until the
    launcher's timeout says so (parlab.launch.diagnose). Over gloo (PARLAB_ONE_GPU), the calls
    gloo cannot make on CUDA tensors go through the host (parlab.comm.staging)."""
    devices.place(gpu)
    if gpu is None:
        return
    torch.cuda.set_device(gpu)
    if nccl:
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    else:
        comm_staging.enable()


def main(rank: int, world_size: int, backend: str, store_path: str, timeout: float,
         payload: bytes, results: Any, lifeline: Any, status: Any,
         trace_dir: str | None = None, gpu: int | None = None, rules: bool = False) -> None:
    """Entry point of one rank: never returns an exception to multiprocessing. `gpu`: this
    rank's GPU under NCCL; `rules`: record calls for parlab.launch.nccl_rules (both decided
    by the caller: a rank's environment is its forkserver's, not the caller's of now)."""
    os.setpgrp()  # our own process group: the parent kills it whole, Ctrl-C is the parent's
    threading.Thread(target=_watch_parent, args=(lifeline,), daemon=True).start()
    _publish(status, {"state": "starting", "t": time.time()})
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
        dist.set_debug_level_from_env()
        devices.pin_numerics()
        take_gpu(gpu, nccl="nccl" in backend)
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
        if dist.get_debug_level() == dist.DebugLevel.DETAIL:  # see comm.route_p2p
            comm.route_p2p(dist.new_group(list(range(world_size))))
        comm.add_listener(_status_listener(status))
        recorder = nccl_rules.Recorder() if rules else None
        if recorder is not None:
            comm.add_listener(recorder)
        fn, args, kwargs = cloudpickle.loads(payload)
        _publish(status, {"state": "running", "t": time.time()})
        if trace_dir is None:
            out = fn(*args, **kwargs)
        else:  # this rank's profile, merged by the parent (parlab.timeline)
            with timeline.profiled(os.path.join(trace_dir, f"rank{rank}.json"),
                                   cuda="nccl" in backend):
                out = fn(*args, **kwargs)
        try:
            blob = on_cpu(("ok", rank, out, recorder.calls if recorder else None))
        except Exception as exc:  # noqa: BLE001 - reported to the learner
            raise TypeError(
                f"rank {rank} returned a {type(out).__name__} that cannot be sent back to "
                f"the caller ({exc}); return tensors, numbers, lists or dicts") from exc
        _publish(status, {"state": "returned", "posted": comm.posted(), "t": time.time()})
        results.send_bytes(blob)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        _publish(status, {"state": "raised", "what": type(exc).__name__, "t": time.time()})
        detail = ("error", rank, type(exc).__name__, str(exc), traceback.format_exc(),
                  time.time())
        try:
            results.send_bytes(pickle.dumps(detail))
        except Exception:  # noqa: BLE001 - parent gone: nothing left to tell
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    # Stay alive until the parent closes the lifeline: a rank that exits early would make
    # its peers fail with "connection reset" instead of the real cause.
    threading.Event().wait()
