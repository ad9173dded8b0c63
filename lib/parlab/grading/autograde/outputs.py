"""Output limits: a cell that prints gigabytes scores 0, and the grader stays small.

Learner code may print without end: a loop that prints every value of a tensor, a traceback
of a string the size of memory. nbclient keeps every output it receives, so the grader's
memory, the graded notebook and the feedback built from it would all grow without bound
(nbgrader's LimitOutput only trims the notebook after the run, once the memory is spent).

`OutputLimits`, a mixin for a NotebookClient (ResilientExecute's first base), counts the
bytes of every output message as it arrives, in `process_message`, before nbclient stores it:
stream text, the data and metadata of displays and results, the text of errors, and those
routed into an Output widget. Each message also counts OVERHEAD bytes, its wrapper, so a
flood of tiny flushed prints is bounded too. The count only grows: a `clear_output` or a
display update gives nothing back (the cell printed that much, whatever it kept), and an
update of a display_id counts once per output it rewrites. nbclient merges a cell's streams
only after the cell is done, from what was stored, so merging cannot add to the count.

The message that passes `cell_output_limit` (bytes per cell) or `notebook_output_limit`
(bytes per notebook, one `preprocess`) is cut to fit: stream text, the text/plain of a
display (its other formats dropped), the text of an error. Every later output of that cell is
dropped, not stored; an error message is kept as its name alone (once), so that nbgrader does
not put the whole error back from the execute reply. When the cell is done it gets an
`OutputLimit` error, after its own outputs, naming the limit and the number: it scores 0.
Once the notebook's limit is spent, every later cell that prints anything scores 0 likewise.

Per-cell counts restart in `async_execute_cell` (and so `execute_cell`); the notebook's count
restarts in `reset_execution_trackers`, which nbclient's __init__ and ResilientExecute's
preprocess call once per notebook. Cells that ResilientExecute replays after a kernel
restart run on a copy, not on the notebook's own cell: they are bounded per cell but not
counted toward the notebook, since their outputs are thrown away. Widget state sent over
comms is not output and is not counted here. Tested by tests/test_output_limits.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jupyter_core.utils import run_sync
from nbclient.client import NotebookClient
from nbformat import NotebookNode
from traitlets import Integer

from parlab.grading.base.cells import error_output

if TYPE_CHECKING:  # the executors (nbgrader's Execute) are untyped: keep them so for mypy
    _Client = Any
else:
    _Client = NotebookClient

OVERHEAD = 64  # bytes each output message counts besides its payload
DISPLAYS = {"display_data", "execute_result", "update_display_data"}
PAYLOAD = {"stream": ("text",), "error": ("ename", "evalue", "traceback"),
           **{kind: ("data", "metadata") for kind in DISPLAYS}}  # what a message stores


def text_size(text: str) -> int:
    """UTF-8 bytes of `text` (no copy for ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def cut_text(text: str, room: int) -> str:
    """The start of `text` that fits in `room` UTF-8 bytes."""
    if room <= 0:
        return ""
    if text.isascii():
        return text[:room]
    return text.encode("utf-8", "replace")[:room].decode("utf-8", "ignore")


def payload_size(value: Any) -> int:
    """Bytes of the strings in a JSON-like value, walked without recursion."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += text_size(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            total += 8  # a number, a boolean, null
    return total


def message_size(msg_type: str, content: dict[str, Any]) -> int:
    """What one output message of this type adds to a notebook, in bytes."""
    return OVERHEAD + payload_size([content.get(key) for key in PAYLOAD[msg_type]])


def cut_content(msg_type: str, content: dict[str, Any], room: int) -> dict[str, Any]:
    """`content` cut so that its message fits in `room` bytes, overhead included."""
    room -= OVERHEAD
    if msg_type == "stream":
        return {**content, "text": cut_text(content.get("text") or "", room)}
    if msg_type == "error":
        ename = str(content.get("ename", ""))
        evalue = cut_text(str(content.get("evalue", "")), room - text_size(ename))
        shown = "\n".join(str(line) for line in content.get("traceback") or [])
        shown = cut_text(shown, room - text_size(ename) - text_size(evalue))
        return {**content, "ename": ename, "evalue": evalue, "traceback": [shown]}
    plain = (content.get("data") or {}).get("text/plain")
    text = cut_text(plain if isinstance(plain, str) else "", room - len("text/plain"))
    return {**content, "data": {"text/plain": text}, "metadata": {}}


class OutputLimits(_Client):
    """Bounds a NotebookClient's outputs per cell and per notebook (see the module doc)."""

    cell_output_limit = Integer(
        1_000_000, help="Most bytes of output one cell may store; past it the rest is cut off "
        "and the cell scores 0 (an OutputLimit error).").tag(config=True)
    notebook_output_limit = Integer(
        10_000_000, help="Most bytes of output a whole notebook may store; the cell that passes "
        "it, and every later cell that prints, score 0 (an OutputLimit error).").tag(config=True)

    def reset_execution_trackers(self) -> None:
        super().reset_execution_trackers()
        self._out_notebook_bytes = 0
        self._start_cell_outputs(counts_for_notebook=True)

    def _start_cell_outputs(self, counts_for_notebook: bool) -> None:
        self._out_cell_bytes = 0
        self._out_hit: str | None = None  # "cell" or "notebook", once passed
        self._out_error_kept = False
        self._out_counts = counts_for_notebook

    async def async_execute_cell(self, cell: NotebookNode, cell_index: int,
                                 execution_count: int | None = None,
                                 store_history: bool = True) -> NotebookNode:
        cells = self.nb.cells if getattr(self, "nb", None) is not None else []
        self._start_cell_outputs(cell_index < len(cells) and cells[cell_index] is cell)
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
        finally:
            if self._out_hit:
                cell.outputs.append(error_output("OutputLimit", self._output_limit_text()))

    execute_cell = run_sync(async_execute_cell)

    def process_message(self, msg: dict[str, Any], cell: NotebookNode,
                        cell_index: int) -> NotebookNode | None:
        if msg["msg_type"] in PAYLOAD:
            admitted = self._admit_output(msg)
            if admitted is None:
                return None
            msg = admitted
        return super().process_message(msg, cell, cell_index)

    def _admit_output(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """`msg` as it may be stored: whole, cut to fit, or None (dropped)."""
        msg_type, content = msg["msg_type"], msg["content"]
        if self._out_hit:
            if msg_type != "error" or self._out_error_kept:
                return None
            self._out_error_kept = True  # its name alone, so nbgrader does not add it again
            return {**msg, "content": {**content, "evalue": "", "traceback": []}}
        copies = self._output_copies(msg_type, content)
        if copies == 0:
            return msg  # an update of nothing: nbclient stores nothing
        cost = copies * message_size(msg_type, content)
        cell_room = self.cell_output_limit - self._out_cell_bytes
        notebook_room = (self.notebook_output_limit - self._out_notebook_bytes
                         if self._out_counts else cell_room)
        room = min(cell_room, notebook_room)
        if cost > room:
            self._out_hit = "notebook" if notebook_room < cell_room else "cell"
            content = cut_content(msg_type, content, room // copies)
            cost = copies * message_size(msg_type, content)
            self._out_error_kept = msg_type == "error"
            if cost > room and msg_type != "error":
                return None  # not even an empty one fits
            msg = {**msg, "content": content}
        self._out_cell_bytes += cost
        self._out_notebook_bytes += cost if self._out_counts else 0
        return msg

    def _output_copies(self, msg_type: str, content: dict[str, Any]) -> int:
        """How many outputs this message writes: a display_id's update rewrites every
        output shown with that id (nbclient's _display_id_map), in any cell."""
        transient = content.get("transient")
        display_id = transient.get("display_id") if transient else None
        if not display_id or msg_type not in DISPLAYS:
            return 1
        shown = sum(len(at) for at in self._display_id_map.get(display_id, {}).values())
        return shown + (msg_type != "update_display_data")

    def _output_limit_text(self) -> str:
        advice = ("the rest was cut off and the cell scores 0. Print less: a summary, not "
                  "every value.")
        if self._out_hit == "notebook":
            return (f"the notebook printed more than {self.notebook_output_limit:,} bytes in "
                    f"all (the grader's limit per notebook), passed in this cell; {advice}")
        return (f"this cell printed more than {self.cell_output_limit:,} bytes (the grader's "
                f"limit per cell); {advice}")
