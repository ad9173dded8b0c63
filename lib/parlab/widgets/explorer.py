"""The machinery every explorer is built on: controls -> numbers -> text and a plot.

Each widget is three plain functions plus a constructor, so tests and notebooks can call the
maths and the drawing without a browser:

    compute(**control_values) -> summary dict      pure numbers, from parlab.costs
    describe(summary) -> str                       an HTML line or two
    plot(summary, ax=None) -> Figure               matplotlib, labelled axes, title, legend

`Explorer` wires named controls to them: any control change recomputes the summary, then
rewrites the HTML and redraws the figure in an `Output` (inline backend style: clear, display,
close), both from that one summary; meanwhile the old text is greyed under "updating".
A new widget for a later module is a new triple and a few lines building an `Explorer`.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import clear_output, display
from matplotlib.figure import Figure

Summary = dict[str, Any]
PENDING = "<i>updating for the new settings&hellip;</i><br>"


class Explorer(widgets.VBox):
    """Controls -> compute -> describe + plot, redone on every control change.

    `controls` maps the keyword names `compute` takes to value widgets (sliders, dropdowns).
    Widgets in `header` are shown above them but are not passed to `compute` (e.g. a preset
    dropdown that only moves a slider). After each refresh, `.summary` holds the numbers and
    `.figure` the last figure drawn; `.html` and `.output` are the display widgets.
    """

    def __init__(self, controls: Mapping[str, widgets.ValueWidget],
                 compute: Callable[..., Summary], describe: Callable[[Summary], str],
                 plot: Callable[[Summary], Figure], *, header: tuple[widgets.Widget, ...] = ()):
        super().__init__()
        self.controls = dict(controls)
        self.compute, self.describe, self.plot = compute, describe, plot
        self.html = widgets.HTML()
        self.output = widgets.Output()
        self.summary: Summary = {}
        self.figure: Figure | None = None
        self.children = (*header, *self.controls.values(), self.html, self.output)
        for control in self.controls.values():
            control.observe(self.refresh, names="value")
        self.refresh()

    def values(self) -> dict[str, Any]:
        return {name: control.value for name, control in self.controls.items()}

    def refresh(self, _change: object = None) -> None:
        """Recompute from the controls' values, then show the text and the figure of that one
        summary together. While it computes (a second on a slow widget) the old text is shown
        greyed under "updating", never as the new settings' numbers; a setting the cost models
        refuse (ValueError) is explained in place of the numbers."""
        if self.summary:
            self.html.value = PENDING + f'<span style="opacity: 0.45">{self.html.value}</span>'
        try:
            summary = self.compute(**self.values())
            text, fig = self.describe(summary), self.plot(summary)
        except ValueError as exc:
            self.summary, self.figure = {}, None
            self.html.value = f"<b>Not a possible setting:</b> {html.escape(str(exc))}"
            self.output.clear_output()
            return
        plt.close(fig)  # drawn once, in the Output; pyplot must not show it again
        self.summary, self.figure = summary, fig
        self.html.value = text
        with self.output:
            clear_output(wait=True)
            display(fig)


def log_slider(description: str, value: float, base: float, lo: float, hi: float,
                step: float, fmt: str) -> widgets.FloatLogSlider:
    return widgets.FloatLogSlider(value=value, base=base, min=lo, max=hi, step=step,
                                  description=description, readout_format=fmt,
                                  continuous_update=False, style={"description_width": "10em"},
                                  layout=widgets.Layout(width="36em"))
