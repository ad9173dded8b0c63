"""Values of the course's nbgrader configuration, as nbgrader itself would read them."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable

from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from parlab.grading.base.paths import AUTOGRADER_DIR


def config_value(section: str, name: str, default: object, args: Iterable[str] = ()) -> object:
    """A value of autograder/nbgrader_config.py, with `--Section.name=value` args applied."""
    for arg in args:
        if arg.startswith(f"--{section}.{name}="):
            raw = arg.split("=", 1)[1]
            try:
                return ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                return raw
    config = course_config()
    return config[section].get(name, default) if section in config else default


@functools.lru_cache(maxsize=1)
def course_config() -> Config:
    """autograder/nbgrader_config.py, loaded once."""
    return PyFileConfigLoader("nbgrader_config.py", path=str(AUTOGRADER_DIR)).load_config()
