"""parlab.launch.run: results, errors, hangs, interrupts, and no process left behind.

Expected values come from closed forms (the sum of rank numbers is t(t-1)/2) or from the
failure the test itself injects; every failing case also checks that no rank outlives run().
"""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist

from parlab import launch
from parlab.launch import CollectiveMismatch, CollectiveTimeout, RankError, run

pytestmark = pytest.mark.usefixtures("no_orphans")


def rank_sum(scale, *, offset=0.0):
    x = torch.full((3,), float(dist.get_rank()) * scale + offset)
    dist.all_reduce(x)
    return dist.get_rank(), dist.get_world_size(), x


@pytest.mark.parametrize("t", [1, 2, 4])
def test_results_come_back_in_rank_order(t):
    out = run(rank_sum, t, 2.0, offset=1.0)
    expected = 2.0 * t * (t - 1) / 2 + t * 1.0  # sum over r of (2r + 1)
    assert [o[0] for o in out] == list(range(t))
    assert all(o[1] == t for o in out)
    for _, _, x in out:
        torch.testing.assert_close(x, torch.full((3,), expected))


def test_function_defined_like_a_notebook_cell():
    cell = textwrap.dedent("""
        import torch, torch.distributed as dist
        def cell_fn():
            x = torch.tensor([dist.get_rank() + 1.0])
            dist.all_reduce(x)
            return x.item()
    """)
    namespace = {"__name__": "__main__"}  # what a notebook cell defines into
    exec(compile(cell, "<ipython-input-1>", "exec"), namespace)
    assert run(namespace["cell_fn"], 2) == [3.0, 3.0]


def test_each_rank_gets_its_share_of_cores():
    for t in (1, 2, 4):
        threads = run(torch.get_num_threads, t)
        assert threads == [max(1, (os.cpu_count() or 1) // t)] * t


def test_backend_is_gloo_on_cpu_and_nccl_with_enough_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert launch.pick_backend(2) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert launch.pick_backend(4) == "cpu:gloo,cuda:nccl"  # a CPU tensor still works
    assert launch.pick_backend(8) == "gloo"
    with pytest.raises(ValueError, match="needs 8 GPUs"):
        launch.pick_backend(8, "nccl")
    monkeypatch.undo()
    if torch.cuda.device_count() < 2:
        assert run(lambda: dist.get_backend(), 2) == ["gloo", "gloo"]


def raise_on_one(bad):
    if dist.get_rank() == bad:
        raise ValueError(f"bad value on purpose on rank {bad}")
    x = torch.ones(2)
    dist.all_reduce(x)
    return x


def test_a_rank_that_raises_is_named_with_its_traceback():
    with pytest.raises(RankError) as info:
        run(raise_on_one, 2, 1, timeout=20)
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "bad value on purpose on rank 1" in str(err)
    assert "raise_on_one" in err.traceback
    assert "rank 1 raised ValueError" in str(err)


def skip_collective():
    x = torch.ones(2)
    if dist.get_rank() == 0:
        dist.all_reduce(x)
    return x


def test_skipped_collective_is_a_timeout_that_says_who_waits_where():
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout) as info:
        run(skip_collective, 2, timeout=10)
    assert time.monotonic() - start < 10 + 5
    msg = str(info.value)
    assert "rank 0: waiting in all_reduce" in msg
    assert "rank 1: returned" in msg


def different_collectives():
    x = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(x)
    else:
        dist.broadcast(x, src=0)
    return x


def different_shapes():
    x = torch.ones(4 if dist.get_rank() == 0 else 3)
    dist.all_reduce(x)
    return x


@pytest.mark.parametrize("fn, detail", [(different_collectives, "Op type"),
                                        (different_shapes, "shapes")])
def test_mismatched_collectives_are_reported_never_silently_wrong(fn, detail):
    start = time.monotonic()
    with pytest.raises(CollectiveMismatch) as info:
        run(fn, 2, timeout=10)
    assert time.monotonic() - start < 10 + 5
    assert "do not match" in str(info.value) and detail in str(info.value)


def pipeline_then_all_reduce(batched: bool):
    """A forward pass down a pipeline (the end ranks send or receive once, the middle ones
    twice), then a loss all-reduce: uneven numbers of p2p calls, then one collective."""
    r, w = dist.get_rank(), dist.get_world_size()
    x = torch.full((2,), float(r))
    if batched:  # the same through batch_isend_irecv, in two rounds
        for ops in ([dist.P2POp(dist.irecv, x, r - 1)] if r else [],
                    [dist.P2POp(dist.isend, x, r + 1)] if r < w - 1 else []):
            for req in dist.batch_isend_irecv(ops) if ops else []:
                req.wait()
    else:
        if r:
            dist.recv(x, src=r - 1)
        if r < w - 1:
            dist.send(x, dst=r + 1)
    dist.all_reduce(x)
    return x[0].item()


@pytest.mark.parametrize("batched", [False, True])
def test_collective_after_uneven_point_to_point_is_not_a_mismatch(batched):
    """DETAIL counts p2p calls in a group's sequence numbers; the launcher sends default-group
    p2p through a copy of the world so that a correct collective after a pipeline passes."""
    assert run(pipeline_then_all_reduce, 4, batched, timeout=20) == [0.0] * 4  # x = 0 everywhere


def endless_loop():
    if dist.get_rank() == 1:
        while True:
            pass
    x = torch.ones(1)
    dist.all_reduce(x)


def test_endless_loop_is_stopped_by_the_timeout():
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout) as info:
        run(endless_loop, 2, timeout=3)
    assert time.monotonic() - start < 3 + 5
    assert "rank 1: running its own code" in str(info.value)


def hard_exit():
    if dist.get_rank() == 1:
        os._exit(3)
    x = torch.ones(1)
    dist.all_reduce(x)


def test_a_rank_that_dies_is_reported():
    with pytest.raises(RankError, match="rank 1 died .exit code 3"):
        run(hard_exit, 2, timeout=20)


def test_unpicklable_result_is_explained():
    with pytest.raises(RankError, match="cannot be sent back"):
        run(lambda: threading.Lock(), 2, timeout=20)


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="world_size"):
        run(rank_sum, 0)
    with pytest.raises(ValueError, match="timeout"):
        run(rank_sum, 2, 1.0, timeout=-1)
    with pytest.raises(TypeError, match="function"):
        run("not a function", 2)
    with pytest.raises(TypeError, match="cannot send"):
        run(rank_sum, 2, threading.Lock())


def block_forever():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: blocked inside gloo
    time.sleep(3600)


@pytest.fixture
def python_sigint():
    """SIGINT handled by Python's default handler, as in a kernel. interrupt_main() calls the
    process's handler, and an event loop an earlier test ran in this process (nbclient adds
    asyncio's own handler for SIGINT) can leave one that swallows it."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.mark.usefixtures("python_sigint")
def test_keyboard_interrupt_kills_every_rank():
    timer = threading.Timer(2.0, _thread.interrupt_main)  # what nbgrader's timeout sends
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run(block_forever, 2, timeout=60)
    timer.cancel()
    assert time.monotonic() - start < 10


def test_concurrent_runs_do_not_collide():
    outs, errors = {}, []

    def worker(i):
        try:
            outs[i] = run(rank_sum, 2, float(i))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    for i in range(4):
        torch.testing.assert_close(outs[i][0][2], torch.full((3,), float(i)))


@pytest.mark.slow
def test_concurrent_runs_from_separate_processes(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torch.distributed as dist
        from parlab.launch import run
        def f():
            x = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(x)
            return x.item()
        for _ in range(5):
            assert run(f, 2) == [3.0, 3.0]
        print("ok")
    """))  # no __main__ guard on purpose: run() must not re-run the script in each rank
    jobs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
            for _ in range(3)]
    assert [j.communicate(timeout=120)[0].strip() for j in jobs] == ["ok"] * 3


@pytest.mark.slow
def test_ranks_die_with_a_killed_parent(tmp_path):
    script = tmp_path / "parent.py"
    pids = tmp_path / "pids"
    pids.mkdir()
    script.write_text(textwrap.dedent(f"""
        import os, threading, time
        from parlab.launch import run
        def f():
            open(os.path.join({str(pids)!r}, str(os.getpid())), "w").close()
            time.sleep(3600)
        def die_once_ranks_run():  # the kernel dies mid-run
            while len(os.listdir({str(pids)!r})) < 2:
                time.sleep(0.05)
            os._exit(9)
        threading.Thread(target=die_once_ranks_run, daemon=True).start()
        run(f, 2, timeout=600)
    """))
    proc = subprocess.run([sys.executable, str(script)], timeout=60)
    assert proc.returncode == 9
    ranks = [int(p.name) for p in pids.iterdir()]
    assert len(ranks) == 2
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in ranks):
        time.sleep(0.1)
    assert not [p for p in ranks if os.path.exists(f"/proc/{p}")], "orphaned ranks"


def test_traceback_points_at_the_notebook_cell():
    import linecache

    source = "def cell_fail():\n    raise KeyError('look here')\n"
    filename = "/tmp/ipykernel_0/cell_42.py"  # how ipykernel names a cell's code
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    with pytest.raises(RankError) as info:
        run(namespace["cell_fail"], 2)
    assert f'File "{filename}", line 2, in cell_fail' in info.value.traceback
    assert "raise KeyError('look here')" in str(info.value)


@pytest.mark.slow
def test_start_up_is_not_counted_in_the_timeout(tmp_path, monkeypatch):
    (tmp_path / "slow_to_import.py").write_text(
        "import time\ntime.sleep(3)  # a heavy module import in every rank\n"
        "def answer():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_to_import  # noqa: PLC0415 - the parent imports it too, by reference

    assert run(slow_to_import.answer, 2, timeout=1) == [42, 42]


def both_receive_first():
    r = dist.get_rank()
    x = torch.zeros(4)
    dist.recv(x, src=1 - r)  # each rank waits for the other's send: nobody sends
    dist.send(x, dst=1 - r)


def test_receive_cycle_is_a_deadlock_found_before_the_timeout():
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout, match=r"deadlock: ranks (0 -> 1 -> 0|1 -> 0 -> 1)"):
        run(both_receive_first, 2, timeout=30)
    assert time.monotonic() - start < 15


def ring_with_posted_sends():
    r, t = dist.get_rank(), dist.get_world_size()
    out = torch.full((3,), float(r))
    sending = dist.isend(out, dst=(r + 1) % t)  # posted before the blocking recv
    time.sleep(4 if r == 0 else 0)  # rank 0 is slow; its peers sit in recv meanwhile
    got = torch.empty(3)
    dist.recv(got, src=(r - 1) % t)
    sending.wait()
    return got[0].item()


def test_slow_but_correct_ring_is_not_called_a_deadlock():
    assert run(ring_with_posted_sends, 3, timeout=30) == [2.0, 0.0, 1.0]


# --- what a rank starts with, and what it never imports ---------------------------------------
RANK_SIDE = ["parlab.compose", "parlab.pp", "parlab.cp", "parlab.plan", "parlab.capstone",
             "parlab.check", "parlab.check.composition", "parlab.check.whole", "parlab.check.cp",
             "parlab.check.pp", "parlab.check.checkpoint", "parlab.check.tp", "parlab.check.sp",
             "parlab.check.fsdp", "parlab.check.moe", "parlab.check.collectives"]


def _imports_in_rank(modules):
    import importlib
    import sys

    preloaded = {m: m in sys.modules for m in ("torch._dynamo", "parlab.compose")}
    for name in modules:
        importlib.import_module(name)
    return preloaded, sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib")


def test_ranks_start_with_the_preloads_and_never_import_matplotlib():
    """This session has imported parlab.compose (conftest.py), so its forkserver preloads what
    the first optimizer (torch._dynamo) and module 08's ranks (parlab.compose) would import in
    every rank; the rank-side packages draw nothing, so importing them must not import
    matplotlib (about 1.2 s of CPU a rank)."""
    for preloaded, plotting in run(_imports_in_rank, 2, RANK_SIDE):
        assert all(preloaded.values()), f"not preloaded by the forkserver: {preloaded}"
        assert not plotting, ("a rank-side package imported matplotlib at module level; "
                              f"import it inside the drawing function instead: {plotting[:5]}")


LEAN = """
import sys
from parlab.launch import run
def loaded():
    return [m for m in ("torch._dynamo", "parlab.compose") if m in sys.modules]
print(run(loaded, 2))
"""


def test_a_caller_without_the_composed_model_gets_a_lean_forkserver():
    """A process that never imported parlab.compose or parlab.capstone (a module 02 kernel)
    does not pay for preloading them."""
    proc = subprocess.run([sys.executable, "-c", LEAN], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[[], []]", proc.stdout


def _slow_then_allreduce(seconds: float):
    import time as _time

    if dist.get_rank() == 0:
        _time.sleep(seconds)  # rank 1 waits in the all-reduce meanwhile
    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


def test_a_run_that_waits_shows_an_updating_line_in_a_notebook(monkeypatch):
    """In a kernel, after a few seconds a line says how long, the limit and what the ranks
    do, redrawn about once a second, and cleared when the run ends."""
    from parlab.launch import waiting

    shown: list[str] = []
    monkeypatch.setattr(waiting, "_in_kernel", lambda: True)
    monkeypatch.setattr(waiting.WaitingLine, "_display", lambda self, line: shown.append(line))
    monkeypatch.setattr(waiting.WaitingLine, "close", lambda self: shown.append("<cleared>"))
    assert run(_slow_then_allreduce, 2, waiting.SHOW_AFTER_S + 2.5, timeout=30) == [2.0, 2.0]
    lines = [s for s in shown if s != "<cleared>"]
    assert 2 <= len(lines) <= 5, shown
    assert lines[0].startswith("waiting for 2 of 2 ranks: 3 s (the limit is 30 s"), lines[0]
    assert "rank 0: its own code" in lines[-1] and "rank 1: in all_reduce" in lines[-1], lines
    assert shown[-1] == "<cleared>"


def _crossed_groups():
    """Rank 0: over [0, 1], then the world; rank 1: the world (async, then wait), then [0, 1];
    ranks 2, 3: the world. Each waits for a collective that a member never reaches."""
    pair = dist.new_group([0, 1])
    x = torch.ones(1)
    if dist.get_rank() == 0:
        dist.all_reduce(x, group=pair)
        dist.all_reduce(x)
    elif dist.get_rank() == 1:
        dist.all_reduce(x, async_op=True).wait()
        dist.all_reduce(x, group=pair)
    else:
        dist.all_reduce(x)
    return x.item()


@pytest.mark.usefixtures("no_orphans")
def test_collectives_over_crossed_groups_stop_as_soon_as_the_deadlock_is_certain():
    """No rank runs its own code and every wait needs a member that has made fewer
    collectives on that group: a deadlock, reported in seconds, not at the timeout."""
    start = time.monotonic()
    with pytest.raises(CollectiveTimeout) as info:
        run(_crossed_groups, 4, timeout=40)
    took = time.monotonic() - start
    assert info.value.certain and took < 15, (took, str(info.value))
    text = str(info.value)
    assert "deadlock" in text and "rank 0 waits in all_reduce over ranks [0, 1]" in text, text
    assert "rank 1 waits in all_reduce over ranks [0, 1, 2, 3]" in text, text  # its async wait


@pytest.mark.slow
def test_a_kernel_that_ran_ranks_exits_on_its_own_and_leaves_nothing(tmp_path):
    """A Jupyter kernel (jupyter_client, as JupyterLab starts one) runs a 2-rank `run`, then is
    shut down the way JupyterLab does it (a shutdown request; SIGTERM after half of
    `shutdown_wait_time`, 2.5 s): it exits on its own (status 0, not killed), its forkserver
    and resource tracker end with it, and its /tmp (TMPDIR) is empty: no pymp-* folder, no
    scratch folder (parlab.launch.shutdown; before it, SIGTERM after 2.6 s, both left)."""
    from conftest import descendants
    from jupyter_client.manager import start_new_kernel

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ, TMPDIR=str(tmp)))
    kernel = km.provisioner.process
    try:
        reply = kc.execute_interactive(textwrap.dedent("""
            import torch, torch.distributed as dist
            from parlab.launch import run
            def total():
                x = torch.ones(1) * (dist.get_rank() + 1)
                dist.all_reduce(x)
                return x.item()
            assert run(total, 2) == [3.0, 3.0]
        """), timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        helpers = descendants(kernel.pid)
        assert len(helpers) == 2, f"the forkserver and the resource tracker: {helpers}"
        assert list(tmp.iterdir()), "the run left nothing in TMPDIR while running (premise)"
    finally:
        kc.stop_channels()
        start = time.perf_counter()
        km.shutdown_kernel(now=False)  # the default shutdown_wait_time, 5 s
    took = time.perf_counter() - start
    assert kernel.returncode == 0, f"the kernel was killed ({kernel.returncode}) after {took:.1f} s"
    alive = [p for p in helpers if os.path.exists(f"/proc/{p}")]
    assert not alive, f"helpers outlived the kernel: {alive}"
    assert not list(tmp.rglob("*")), f"left in /tmp: {sorted(map(str, tmp.rglob('*')))}"
    print(f"kernel exited in {took:.2f} s")


def test_without_a_forkserver_run_says_where_the_course_runs(monkeypatch):
    """Native Windows has no forkserver (multiprocessing's start methods there: spawn only):
    run() says which platforms work and that Windows takes WSL 2, before starting anything."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    with pytest.raises(RuntimeError, match="native Windows does not: on Windows, run the course "
                       "in WSL 2"):
        run(rank_sum, 2, 1.0)
