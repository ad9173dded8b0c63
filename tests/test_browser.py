"""The widgets work in a real browser: JupyterLab + headless Chromium, driven by Playwright.

For module 04 (pipeline space-time diagram) and module 01 (memory calculator) the test opens
the notebook in JupyterLab, waits for the kernel, runs only the setup cell (the parlab
imports) and the widget cell (found by its source, `..._explorer(`), waits for the sliders and
the matplotlib plot, screenshots the plot, moves one slider with the keyboard, waits for the
redraw and screenshots it again. It proves that the widgets render and respond (the two
screenshots differ) and that no cell shows an error or stderr output.

JupyterLab serves a temporary copy of course/ holding only modules 01 and 04, with its own
settings, workspace and runtime folders: the committed release and the user's Jupyter setup
are never touched. Screenshots are kept in artifacts/browser/ (<module>-before.png,
<module>-after.png, <module>-failure.png, the whole page, when a step fails, and the server's
jupyter.log).

Chromium comes from Debian's packages (`make browser`, run by `make test`); Playwright never
downloads a browser of its own. The test skips, saying so, only when /usr/bin/chromium is
missing or playwright is not installed. Run it alone with

    .venv/bin/pytest tests/test_browser.py -q
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, descendants
from matplotlib.image import imread

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = ROOT / "artifacts" / "browser"
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
KERNEL_S = 180  # kernel start plus `import torch` on a loaded 2-core machine
STEP_S = 60  # one widget render or redraw
WHOLE_S = 300  # module 07 run top to bottom (about 60 s on an idle 2-core machine)
# Lab settings: every cell in the DOM (no virtual scrolling), no news or update toasts.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
}


@dataclass(frozen=True)
class Module:
    folder: str
    slider: str  # the description of the slider the test moves
    presses: int  # ArrowRight presses on it


WHOLE = "07_composition"  # run top to bottom from its solutions: planner, progress bar, capstone
MODULES = [
    Module("04_pipeline_parallel", "stages p", 1),  # p = 4 -> 5: one more row of the diagram
    Module("01_memory_and_sharding", "sequence", 1),  # 4096 -> 8192: activations double
]


# --- JupyterLab --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lab:
    url: str
    token: str

    def notebook_url(self, folder: str) -> str:
        # `reset`: a fresh workspace, so the previous module's tab is not reopened
        return f"{self.url}/lab/tree/{folder}/{folder}.ipynb?reset&token={self.token}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(folder: Path) -> None:
    for name, values in LAB_SETTINGS.items():
        path = folder / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _wait_until_up(proc: subprocess.Popen, url: str, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server (it shuts its kernels down), then kill whatever it left behind:
    kernels run in their own sessions, so they are collected as descendants beforehand."""
    started = descendants(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _serve(tmp_path: Path, root: Path, *, learner: bool = False):
    """JupyterLab on `root`; with `learner`, as `make lab` serves it: the learner's Jupyter
    configuration (autograder/jupyter/learner/) and the repository root as its working
    directory (Validate reads ./nbgrader_config.py there)."""
    _write_settings(tmp_path / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if learner:
        env["JUPYTER_CONFIG_PATH"] = str(ROOT / "autograder" / "jupyter" / "learner")
    log = tmp_path / "jupyter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser",
             f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
             f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", "--allow-root"],
            cwd=ROOT if learner else tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until_up(proc, f"{url}/api/status?token={token}", log)
        yield Lab(url, token)
    finally:
        _stop(proc)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / ("learner-jupyter.log" if learner else "jupyter.log"))


@pytest.fixture
def lab(tmp_path: Path, no_orphans) -> Lab:
    root = tmp_path / "course"
    for module in MODULES:
        shutil.copytree(ROOT / "course" / module.folder, root / module.folder)
    shutil.copytree(ROOT / "solutions" / WHOLE, root / WHOLE)  # answered: it runs top to bottom
    yield from _serve(tmp_path, root)


VALIDATED = "00_collectives"
WRONG_RING = "def ring_allreduce(x):\n    return x.clone()  # sends nothing\n"


@pytest.fixture
def learner_lab(tmp_path: Path, no_orphans) -> Lab:
    """`make lab`'s server on module 00 cut to its imports, its first answer and that answer's
    test cell (Validate runs every cell: seconds, not a minute), with a wrong ring all-reduce
    whose check fails with a 'Likely mistake' line longer than the dialog is wide."""
    import nbformat

    nb = nbformat.read(ROOT / "course" / VALIDATED / f"{VALIDATED}.ipynb", as_version=4)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in nb.cells]
    nb.cells[ids.index("ring_allreduce_answer")].source = WRONG_RING
    nb.cells = [c for c, gid in zip(nb.cells, ids, strict=True)
                if "imports" in c.metadata.get("tags", []) or gid.startswith("ring_allreduce")]
    (tmp_path / "course" / VALIDATED).mkdir(parents=True)
    nbformat.write(nb, tmp_path / "course" / VALIDATED / f"{VALIDATED}.ipynb")
    yield from _serve(tmp_path, tmp_path / "course", learner=True)


# --- the browser -------------------------------------------------------------------------------
@pytest.fixture
def page(no_orphans):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: run `make setup` (it is in the dev extras)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM}: run `make browser` as root (or with "
                    "passwordless sudo), or `apt-get install chromium` on Debian/Ubuntu")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(STEP_S * 1000)
            yield page
        finally:
            browser.close()


# --- driving a notebook ------------------------------------------------------------------------
def _code_cells(page):
    return page.locator(".jp-NotebookPanel:visible .jp-CodeCell")


def _find_cells(page, folder: str) -> tuple[int, int]:
    """Indices (among code cells) of the setup cell and of the single widget cell."""
    sources = _code_cells(page).evaluate_all(
        "cells => cells.map(c => c.querySelector('.jp-InputArea-editor').innerText)")
    setup = [i for i, s in enumerate(sources) if "from parlab" in s and "import" in s]
    widget = [i for i, s in enumerate(sources) if re.search(r"^\w+_explorer\(", s, re.M)]
    assert setup and len(widget) == 1, f"{folder}: setup cells {setup}, widget cells {widget}"
    return setup[0], widget[0]


def _wait_for_kernel(page) -> None:
    """The execution indicator says idle before a kernel is attached ("No Kernel |
    Initializing"), and a cell run then is dropped: wait for the status bar's kernel too."""
    from playwright.sync_api import expect

    panel = page.locator(".jp-NotebookPanel:visible")
    idle = panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
    expect(idle).to_be_visible(timeout=KERNEL_S * 1000)
    kernel = page.locator(".jp-StatusBar-TextItem").filter(
        has_text=re.compile(r"^(?!No Kernel).+ \| Idle$"))
    expect(kernel.first).to_be_visible(timeout=KERNEL_S * 1000)


def _run_cell(page, cell, timeout_s: float, tries: int = 3) -> None:
    """Select the cell by its prompt, Shift+Enter, wait for its execution count. A run that is
    not even queued ([*]) within a few seconds is retried: the kernel was not attached yet."""
    from playwright.sync_api import expect

    prompt = cell.locator(".jp-InputPrompt")
    for attempt in range(tries):
        prompt.click()
        page.keyboard.press("Shift+Enter")
        try:
            expect(prompt).to_have_text(re.compile(r"\[(\*|\d+)\]"), timeout=10_000)
            break
        except AssertionError:
            if attempt == tries - 1:
                raise
            print(f"run of cell not queued, retrying ({attempt + 1}/{tries - 1})")
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=timeout_s * 1000)


def _plot(cell):
    return cell.locator(".widget-output img").first


def _shot(cell, path: Path) -> np.ndarray:
    """Screenshot the widget's plot, once its image is loaded, into `path`."""
    from playwright.sync_api import expect

    img = _plot(cell)
    expect(img).to_be_visible()
    expect(img).to_have_js_property("complete", True)
    img.screenshot(path=path)
    return imread(path)


def _move_slider(page, cell, description: str, presses: int) -> None:
    """Focus the slider's handle and press ArrowRight; wait until its readout and plot change."""
    from playwright.sync_api import expect

    slider = cell.locator(".widget-slider").filter(has_text=description)
    expect(slider).to_have_count(1)
    readout = slider.locator(".widget-readout")
    before, src = readout.inner_text(), _plot(cell).get_attribute("src")
    slider.locator(".noUi-handle").focus()
    for _ in range(presses):
        page.keyboard.press("ArrowRight")
    expect(readout).not_to_have_text(before)
    expect(_plot(cell)).not_to_have_attribute("src", src)


def _assert_no_errors(page, folder: str) -> None:
    errors = page.locator(f".jp-NotebookPanel:visible {STDERR}").all_inner_texts()
    assert not errors, f"{folder}: a cell shows an error or stderr output:\n" + "\n".join(errors)
    broken = page.get_by_text(re.compile("Error displaying widget|Failed to load model"))
    assert broken.count() == 0, f"{folder}: a widget failed to render"


def _differs(a: np.ndarray, b: np.ndarray) -> float:
    """Share of pixels that differ (1.0 when the sizes differ)."""
    if a.shape != b.shape:
        return 1.0
    return float(np.mean(np.any(np.abs(a - b) > 1e-3, axis=-1)))


def _exercise(page, lab: Lab, module: Module) -> None:
    from playwright.sync_api import expect

    page.goto(lab.notebook_url(module.folder))
    _wait_for_kernel(page)
    setup, widget = _find_cells(page, module.folder)
    cells = _code_cells(page)
    _run_cell(page, cells.nth(setup), KERNEL_S)
    cell = cells.nth(widget)
    _run_cell(page, cell, STEP_S)
    expect(cell.locator(".widget-slider").first).to_be_visible()
    before = _shot(cell, ARTIFACTS / f"{module.folder}-before.png")
    _move_slider(page, cell, module.slider, module.presses)
    after = _shot(cell, ARTIFACTS / f"{module.folder}-after.png")
    cell.locator(".jp-Cell-outputArea").screenshot(path=ARTIFACTS / f"{module.folder}-widget.png")
    changed = _differs(before, after)
    assert changed > 0.001, f"{module.folder}: the plot did not change ({changed:.2%} of pixels)"
    _assert_no_errors(page, module.folder)


@pytest.mark.slow
def test_widgets_render_and_respond_in_chromium(page, lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    for module in MODULES:
        start = time.perf_counter()
        try:
            _exercise(page, lab, module)
        except BaseException:
            page.screenshot(path=ARTIFACTS / f"{module.folder}-failure.png", full_page=True)
            raise
        print(f"{module.folder}: {time.perf_counter() - start:.1f} s")


@pytest.mark.slow
def test_module_07_runs_top_to_bottom_in_chromium(page, lab):
    """Module 07 as a learner who has answered everything meets it: Run All in JupyterLab, on
    CPU. Every cell runs without an error, the capstone's progress bar fills, and its loss plot
    and the planner widget render (screenshots in artifacts/browser/)."""
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1400, "height": 2800})  # tall: a whole widget in one shot
    page.goto(lab.notebook_url(WHOLE))
    _wait_for_kernel(page)
    cells = _code_cells(page)
    cells.first.locator(".jp-InputPrompt").click()
    page.keyboard.press("Control+Shift+C")  # the command palette
    page.keyboard.type("Run All Cells")
    page.keyboard.press("Enter")
    start = time.perf_counter()
    try:
        expect(cells.last.locator(".jp-InputPrompt")).to_have_text(
            re.compile(r"\[\d+\]"), timeout=WHOLE_S * 1000)
        _assert_no_errors(page, WHOLE)
        sources = cells.evaluate_all(
            "cells => cells.map(c => c.querySelector('.jp-InputArea-editor').innerText)")
        for name, needle in (("capstone", "run_capstone(cfg"), ("planner", "planner_widget()")):
            cell = cells.nth(next(i for i, s in enumerate(sources) if needle in s))
            expect(cell.locator(".jp-OutputArea-output img").first).to_be_visible()
            if name == "capstone":
                expect(cell.locator(".widget-hprogress").first).to_be_visible()
                expect(cell).to_contain_text("30/30 steps")
            cell.scroll_into_view_if_needed()
            cell.screenshot(path=ARTIFACTS / f"{WHOLE}-{name}.png")
    except BaseException:
        page.screenshot(path=ARTIFACTS / f"{WHOLE}-failure.png", full_page=True)
        raise
    print(f"{WHOLE}: Run All in {time.perf_counter() - start:.1f} s")


@pytest.mark.slow
def test_validate_shows_progress_and_whole_lines(page, learner_lab):
    """nbgrader's Validate as a learner meets it (parlab.grading.learner.validate_button): while it
    runs, a spinner and a line beside the button say what runs and how long it takes; the
    dialog then shows the failed check's whole message, no line cut off by its width."""
    from playwright.sync_api import expect

    from parlab.grading.learner.validate_button import RUNNING

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(learner_lab.notebook_url(VALIDATED))
    button = page.locator(".validate-button")  # nbgrader's jp-button, in a toolbar item
    expect(button).to_be_visible(timeout=KERNEL_S * 1000)  # Validate needs no kernel here
    item = page.locator(".jp-Toolbar-item").filter(has=button)
    try:
        button.click()
        expect(button).to_contain_text("Validating...", timeout=30_000)
        said = item.evaluate("b => getComputedStyle(b, '::after').content")
        assert said == f'"{RUNNING}"', f"no progress line beside the button: {said}"
        page.locator(".jp-NotebookPanel-toolbar").screenshot(
            path=ARTIFACTS / "validate-running.png")
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_be_visible(timeout=KERNEL_S * 1000)
        dialog.screenshot(path=ARTIFACTS / "validate-dialog.png")
        blocks = dialog.locator("pre").evaluate_all(
            "ps => ps.map(p => [p.scrollWidth, p.clientWidth, p.innerText])")
        text = " ".join(" ".join(b[2] for b in blocks).split())
        assert "Likely mistake: send chunks to your right neighbour with dist.isend (or " \
            "dist.send) and receive from the left with dist.irecv (or dist.recv)" in text, text
        cut = [b for b in blocks if b[0] > b[1]]
        assert not cut, f"lines wider than the dialog (scrollWidth, clientWidth, text): {cut}"
    except BaseException:
        page.screenshot(path=ARTIFACTS / "validate-failure.png", full_page=True)
        raise
