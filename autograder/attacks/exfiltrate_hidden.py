"""Read the hidden tests as the learner's kernel runs them, and smuggle them into feedback.

Its first answer cell registers an IPython `pre_run_cell` hook that sees the source of every
later cell before it runs. A test cell whose source holds hidden tests is printed base64
encoded (so that no search of the feedback for hidden lines could find it), after the
attack's marker. Its answers stay blank.

What must stop it: where the verifier grades the module, the learner's kernel runs only the
visible part of each test cell; the hidden tests run in the verifier, which never runs learner
code. The hook sees no hidden test, prints no marker, and the attacker scores 0.
"""

ANSWERS = {"mean_answer": r'''
import base64

MARK = "PWN" + "ED-exfiltrate_hidden"  # built here, so that the notebook itself never holds it
seen = []


def peek(info):
    seen.append(info.raw_cell)
    if "HIDDEN" + " TESTS" in info.raw_cell or "hidden" + " check" in info.raw_cell:
        print(MARK, base64.b64encode(info.raw_cell.encode()).decode())


get_ipython().events.register("pre_run_cell", peek)  # noqa: F821 - the kernel's shell
print("exfiltrate_hidden: a pre_run_cell hook now sees every later cell's source")


def mean_over_ranks(x):
    raise NotImplementedError
'''}
MAX_SECONDS = 60
