"""parlab.errors: the one refusal mechanism, and what a learner reads when something fails.

Refusal: every way an answer can reach a reference (the function itself, an alias taken before
the block, a wrapper, a subclass whose __init__ calls super(), an autograd Function's static
forward) raises CheckFailed inside `refused`, and everything runs as written after it, also when
the block ends with an exception.

Rendering: in a notebook (IPython's `_render_traceback_`) a failure shows its message and the
frames of the learner's own code, never parlab's. tests/test_render.py checks the same in a real
kernel, on a course notebook.
"""

from __future__ import annotations

import pytest
import torch

from parlab import comm
from parlab.check import call_learner, fail
from parlab.errors import CheckFailed, learner_frames, reference_message, refused
from parlab.launch import CollectiveTimeout, RankError, run

MESSAGE = reference_message("the reference")


def reference(x):
    return x + 1


class Reference(torch.nn.Module):
    def __init__(self, n):
        super().__init__()  # a closure cell (__class__): the swap must fit it
        self.n = n

    def forward(self, x):
        return x * self.n


class RefFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


alias = reference


def wrapper(x):
    return reference(x)


class Sub(Reference):
    def __init__(self):
        super().__init__(3)


@pytest.mark.parametrize("call", [
    lambda: reference(1), lambda: alias(1), lambda: wrapper(1), lambda: Reference(2),
    lambda: Sub(), lambda: RefFn.apply(torch.ones(2)),
], ids=["itself", "alias", "wrapper", "class", "subclass", "autograd-function"])
def test_every_path_to_a_reference_is_refused(call):
    with refused([reference, Reference, RefFn], MESSAGE):
        with pytest.raises(CheckFailed, match="the course's own reference implementation"):
            call()
    call()  # restored


def test_refusal_lifts_after_an_exception_and_nests():
    with pytest.raises(ZeroDivisionError):
        with refused([reference], MESSAGE):
            raise ZeroDivisionError("inside the block")
    assert reference(1) == 2
    with refused([reference], "outer"):
        with refused([Reference], "inner"):
            with pytest.raises(CheckFailed, match="outer"):
                reference(1)
        assert Reference(2)(torch.ones(1)).item() == 2  # the inner block is over
    assert reference(1) == 2


def test_refused_takes_functions_and_classes_only():
    with pytest.raises(TypeError, match="functions and classes"):
        with refused([42], MESSAGE):
            pass


def _learner_code(x):
    return x @ x  # (3, 2) @ (3, 2): a shape error in the learner's own frame


def test_check_failure_renders_the_message_and_the_learners_frames_only():
    try:
        call_learner("your function", _learner_code, torch.ones(3, 2))
    except CheckFailed as exc:
        lines = exc._render_traceback_()
    text = "\n".join(lines)
    assert lines[0].startswith("CheckFailed: your function raised RuntimeError")
    assert "Likely mistake:" in text
    assert "in _learner_code" in text and "x @ x" in text  # the learner's frame and line
    assert "parlab/check" not in text and "_harness" not in text


def test_plain_python_keeps_the_whole_message():
    with pytest.raises(CheckFailed) as info:
        fail("y differs", rank=1, hint="add the bias once")
    assert str(info.value) == "rank 1: y differs\nLikely mistake: add the bias once"


def _raises_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad shard")
    return 0


def test_rank_error_renders_without_launcher_frames():
    with pytest.raises(RankError) as info:
        run(_raises_on_rank_one, 2)
    lines = info.value._render_traceback_()
    text = "\n".join(lines)
    assert lines[0] == "RankError: rank 1 raised ValueError: bad shard"
    assert "in _raises_on_rank_one" in text and "raise ValueError" in text
    assert "parlab/launch" not in text and "state of every rank" not in text
    assert "--- traceback on rank 1 ---" in str(info.value)  # plain Python: all of it


def _skips_the_all_reduce():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))


def test_a_certain_hang_says_it_stopped_early():
    with pytest.raises(CollectiveTimeout) as info:
        run(_skips_the_all_reduce, 2, timeout=30)
    assert info.value.certain and info.value.elapsed < 30
    text = "\n".join(info.value._render_traceback_())
    assert "stopped early" in text and "the hang is certain" in text
    assert "within" not in text.split("\n")[0]  # no "did not finish within 30 s" beside it


def test_learner_frames_drop_library_files():
    tb = (f'  File "{comm.__file__}", line 10, in trace\n    x = 1\n'
          '  File "/home/me/notebook_cell.py", line 3, in forward\n    return x @ w\n'
          f'  File "{torch.__file__}", line 5, in matmul\n    pass\n')
    assert learner_frames(tb) == [
        "  /home/me/notebook_cell.py, line 3, in forward\n    return x @ w"]


def test_a_stub_reached_by_a_kernel_check_shows_its_own_line_only():
    """A check run in the kernel that reaches the release's stub reads as the stub's
    NotImplementedError and its line, not the check's frames; nothing is recorded for it."""
    import pickle

    from parlab.check import exercise
    from parlab.errors import NotWritten

    source = "def answer(x):\n    raise NotImplementedError('Write your answer here')\n"
    namespace: dict = {}
    exec(compile(source, "/tmp/ipykernel_0/cell_7.py", "exec"), namespace)

    @exercise("stub_demo")
    def check_demo(fn):
        return call_learner("your answer", fn, 1)

    with pytest.raises(NotImplementedError) as info:
        check_demo(namespace["answer"])
    assert isinstance(info.value, NotWritten)
    lines = info.value._render_traceback_()
    assert lines[0] == "NotImplementedError: not written yet: Write your answer here", lines
    assert any("cell_7.py, line 2, in answer" in ln for ln in lines), lines
    assert not any("parlab" in ln for ln in lines[1:]), lines
    again = pickle.loads(pickle.dumps(info.value))  # it crosses to the verifier and back
    assert str(again) == str(info.value) and again.learner_traceback


def test_a_scalar_mismatch_reads_as_got_against_expected():
    """A 0-d tensor (a loss) is one number: the message says got, expected and the difference,
    never "1 of 1 entries" or "index ()" (issue 44.4, seen on module 02's exercise 8)."""
    from parlab.check._compare import assert_close

    for got, want, says in ((2.5, 2.4, "off by +0.1 (4.17% of the expected value"),
                            (-3.0, 3.0, "got/expected = -1"), (float("nan"), 1.0, "is nan")):
        with pytest.raises(CheckFailed) as info:
            assert_close(torch.tensor(got), torch.tensor(want), name="the loss", rank=1)
        text = str(info.value)
        assert text.startswith(f"rank 1: the loss is {got:g}, expected {want:.8g}"), text
        assert says in text and "entries" not in text and "index" not in text, text
    with pytest.raises(CheckFailed, match=r"1 of 3 entries; worst at index \(2,\)"):
        assert_close(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 2.0, 3.0]), name="y")


def _stub_cell() -> dict:
    """A release's answer cell, as a kernel compiles it (cloudpickle ships it by value)."""
    source = "def answer(x):\n    raise NotImplementedError('Write your answer here')\n"
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, "/tmp/ipykernel_0/cell_7.py", "exec"), namespace)
    return namespace


def _calls_answer(fn):
    return call_learner("your answer", fn, torch.ones(2))


def test_a_stub_reached_on_every_rank_reads_as_the_kernels():
    """An unwritten answer checked on several ranks (every rank raised the stub on its own)
    reads as the one checked in the kernel: 'not written yet' and the stub's line, not a
    RankError naming one rank and the others as 'most likely a consequence'."""
    from parlab.check import exercise, run_checked

    @exercise("stub_in_kernel")
    def check_in_kernel(fn):
        return call_learner("your answer", fn, torch.ones(2))

    @exercise("stub_on_ranks")
    def check_on_ranks(fn):
        return run_checked(_calls_answer, 3, fn, what="your answer", hang_hint="-")

    answer = _stub_cell()["answer"]
    with pytest.raises(NotImplementedError) as kernel:
        check_in_kernel(answer)
    with pytest.raises(RankError) as ranks:
        check_on_ranks(answer)
    assert ranks.value.unwritten and ranks.value.exc_type == "NotImplementedError"
    kernel_lines = kernel.value._render_traceback_()
    rank_lines = ranks.value._render_traceback_()
    # the same message and the stub's line (the check's frames differ: this file counts as
    # the learner's here, as a cell would)
    assert rank_lines[0] == kernel_lines[0] == (
        "NotImplementedError: not written yet: Write your answer here"), rank_lines
    assert rank_lines[-1] == kernel_lines[-1], (rank_lines, kernel_lines)
    assert "cell_7.py, line 2, in answer" in rank_lines[-1]
    assert not any("rank" in ln for ln in rank_lines), rank_lines


def _module_without_forward():
    return torch.nn.Module()(torch.ones(2))  # torch raises NotImplementedError: no forward


def test_torchs_own_not_implemented_error_is_not_a_stub():
    """A NotImplementedError raised inside torch (here: a module without forward) is a mistake
    to report, not an unwritten answer: a CheckFailed in the kernel, a RankError on ranks."""
    with pytest.raises(CheckFailed) as kernel:
        call_learner("your layer", torch.nn.Module(), torch.ones(2))
    assert "your layer raised NotImplementedError" in str(kernel.value)
    with pytest.raises(RankError) as ranks:
        run(_module_without_forward, 2)
    assert not ranks.value.unwritten
    assert ranks.value._render_traceback_()[0].startswith(
        "RankError: rank ")
    assert "raised NotImplementedError: Module [Module] is missing" in ranks.value.head


def test_a_stub_is_the_learners_own_raise():
    """stub_raised: the innermost frame is the learner's and its line a raise (or unknown, as
    for code run from its text); a NotImplementedError torch raises from a learner's line
    (an op the device lacks) is not a stub."""
    from parlab.errors import stub_raised

    cell = '  File "/tmp/ipykernel_1/2.py", line 3, in answer\n    {}\n'
    assert stub_raised(cell.format('raise NotImplementedError("Write your answer here")'))
    assert not stub_raised(cell.format("y = x.to_sparse() @ w"))
    assert stub_raised('  File "<answer cell>", line 3, in answer\n')
    assert not stub_raised(f'  File "{torch.__file__}", line 9, in f\n    raise X\n')
    assert not stub_raised("")
