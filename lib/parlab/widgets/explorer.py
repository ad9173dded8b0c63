"""The machinery every explorer is built on: controls -> numbers -> text and a plot.

Each widget is three plain functions plus a constructor, so tests and notebooks can call the
maths and the drawing without a browser:

    compute(**control_values) -> summary dict      pure numbers, from parlab.costs
    describe(summary) -> str                       an HTML line or two
    plot(summary, ax=None) -> Figure               matplotlib, labelled axes, title, legend

`Explorer` wires named controls to them: any control change recomputes the summary, rewrites
the HTML and redraws the figure in an `Output` (inline backend style: clear, display, close).
A new widget for a later module is a new triple and a few lines building an `Explorer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import clear_output, display
from matplotlib.figure import Figure

Summary = dict[str, Any]


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
        self.summary = self.compute(**self.values())
        self.html.value = self.describe(self.summary)
        fig = self.plot(self.summary)
        plt.close(fig)  # drawn once, in the Output; pyplot must not show it again
        self.figure = fig
        with self.output:
            clear_output(wait=True)
            display(fig)


def log_slider(description: str, value: float, base: float, lo: float, hi: float,
                step: float, fmt: str) -> widgets.FloatLogSlider:
    return widgets.FloatLogSlider(value=value, base=base, min=lo, max=hi, step=step,
                                  description=description, readout_format=fmt,
                                  continuous_update=False, style={"description_width": "10em"},
                                  layout=widgets.Layout(width="36em"))
