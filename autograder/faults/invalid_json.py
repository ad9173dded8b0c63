"""A notebook that is not valid JSON: the file was cut short while saving.

nbgrader alone drops the submission with no score and no feedback. Expected: every test
scores 0 with InvalidNotebook, whose message quotes the JSON error and says how to repair
the file; no kernel is started.
"""


def RAW(text: str) -> str:  # noqa: N802 - the corpus's name for "edit the file's text"
    return text[: len(text) // 2]


EXPECT = {
    "mean_test": ("InvalidNotebook", "is not a valid notebook"),
    "double_test": ("InvalidNotebook", "is not a valid notebook"),
    "square_test": ("InvalidNotebook", "is not a valid notebook"),
}
MAX_SECONDS = 5
