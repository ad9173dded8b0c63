"""What runs inside a submission's sandbox on behalf of the grader's verifier.

The verifier (parlab.grading.verify) never runs learner code; it asks a sandboxed kernel to.
This package is that kernel's side and its ranks', kept apart from parlab.grading so that a
rank imports only what it needs:

- `wire`: plain data across the boundary (`encode` in the sandbox, `decode` in the verifier),
  and `Answer`, a learner's name seen from the verifier;
- `host`: the requests the sandboxed kernel serves (run a worker on ranks that first run the
  learner's code, call a learner's function, read a learner's value).
"""

MODE = ""
"""In a rank the verifier started: "learner" where learner code runs (a check's helpers then
skip the reference and hand each rank only what it owns), "trusted" where the instructor's
solution runs to make the reference; "" everywhere else (a notebook, a test)."""
