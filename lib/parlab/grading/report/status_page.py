"""`make status` as a page of the instructor's server: `/user/<instructor>/parlab/status`.

A Jupyter server extension that the hub enables on instructors' servers only
(autograder/hub/jupyter/instructor/jupyter_server_config.json, on their JUPYTER_CONFIG_PATH by
parlab.hub.hooks; `make formgrader` does not load it). `?module=00_collectives` shows one
module; without it, every module with a record. It reads what `make status` reads
(parlab.grading.report.status), as the instructor's account, each time it is opened: the course root
(PARLAB_COURSE_ROOT), the exchange (PARLAB_HUB_EXCHANGE, PARLAB_HUB_COURSE_ID) and the roster
(the gradebook, PARLAB_HUB_LEARNERS), which the hub hands to the server.
"""

from __future__ import annotations

import html
from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from parlab.grading.report.status import (
    COLUMNS,
    cells,
    course_root,
    modules_with_records,
    status_table,
    summary,
    when,
)
from parlab.hub.records import exchange_course

__all__ = ["StatusHandler", "page"]


def page(modules: list[str] | None = None) -> str:
    """The status page's HTML for `modules` (None: every module with a record)."""
    root, exchange = course_root(), exchange_course()
    parts = ["<!doctype html><meta charset='utf-8'><title>Parallelism Lab: status</title>",
             "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
             "th{background:#f3f3f3}</style>",
             "<h1>Who has fetched, submitted, been graded</h1>"]
    for module in modules or modules_with_records(root, exchange):
        table = status_table(module, root, exchange)
        columns = [c for c in COLUMNS if c != "fetched" or table.exchange]
        due = when(table.due) if table.due else "no due date in the gradebook"
        parts.append(f"<h2 id='{html.escape(module)}'>{html.escape(module)}</h2>"
                     f"<p>due {html.escape(due)}; {html.escape(summary(table))}</p><table><tr>"
                     + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>")
        for row in table.rows:
            text = cells(table, row)
            parts.append("<tr>" + "".join(f"<td>{html.escape(text[c])}</td>" for c in columns)
                         + "</tr>")
        parts.append("</table>")
    if len(parts) == 3:
        parts.append("<p>No module has a record yet: nothing released, collected or in the "
                     "gradebook.</p>")
    return "\n".join(parts)


class StatusHandler(JupyterHandler):
    @web.authenticated
    def get(self) -> None:
        module = self.get_argument("module", "")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(page([module] if module else None))


def _load_jupyter_server_extension(server_app: Any) -> None:
    web_app = server_app.web_app
    route = url_path_join(web_app.settings["base_url"], "parlab", "status")
    web_app.add_handlers(".*$", [(route, StatusHandler)])
    server_app.log.info("parlab: the class's status at %s", route)


load_jupyter_server_extension = _load_jupyter_server_extension
