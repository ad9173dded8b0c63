"""parlab.grading.autograde: the instructor's step 3 for one submission, inside nbgrader.

What nbgrader runs for each notebook it grades (autograder/nbgrader_config.py names these):

- `execute`: `ResilientExecute`, the executor that grades every submission whatever its
  kernel does (hangs, dies, floods its output), in a sandbox, with the verifier;
- `kernels`, `warm`, `zygote`: where a submission's kernel starts (forked from a warm template
  that has imported torch), and in what;
- `limits` and `outputs`: what a submission may use, and what a cell reads when it used too
  much; `names`: which cell defines a name a later cell lacks; `profile`: where the time goes;
- `overwrite`: restored test cells marked; `late`: the late penalty (a share per day).

May import: parlab.grading.base, parlab.grading.sandbox, parlab.grading.verify.
"""
