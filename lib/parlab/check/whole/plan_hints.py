r"""The hints of module 08's exercise 4 (`parlab.check.whole.plan`): what each wrong number most
likely means, in the exercise's symbols ($L_s = \lceil L/p \rceil$, $s_c = s/c$, $P_0$ the
parameters of the first or last stage before TP splits them).

`memory_hint` reads the wrong number against the right one: the loss's fp32 logits counted in
bf16, not split over TP or CP, on the first stage, or for min(p, m) micro-batches; the last
stage charged the first stage's micro-batches in flight. `CHANGED` is what an answer written
before the logits and the `stage` argument were added reads.
"""

from __future__ import annotations

__all__ = ["MEMORY_HINTS", "BYTES_HINTS", "LINK", "CHANGED", "TP_WITHOUT_REGATHER",
           "memory_hint"]

CHANGED = ("exercise 4 changed: the last pipeline stage holds the output layer and the loss's "
           "fp32 logits, so memory_per_gpu now takes stage=\"first\" or \"last\" and returns a "
           "\"logits\" entry too (see What to write); an answer written before the change "
           "fails here until it does")
TP_WITHOUT_REGATHER = (
    "that is 16 (t-1)/t b s_c h per layer and micro-batch: TP's four all-reduces, which is what "
    "TP with SP sends only when it keeps the gathered inputs for backward. The activations here "
    "(34 s_c b h / t per layer) keep the sequence-sharded ones, so the backward re-gathers them "
    "with two all-gathers more: 20 (t-1)/t (module 03). Exercise 4 priced 16 before this "
    "release: an answer written then fails here until it does")
LOGITS = ("the stage that computes the loss (the last, or the only one when p = 1) keeps one "
          "micro-batch's fp32 logits for backward, 4 b s_c V / t bytes (vocabulary-parallel: "
          "each TP rank its V/t columns); the first stage of a pipeline keeps none")
MEMORY_HINTS = {
    "weights": "weights are 2 bytes per parameter of the stage, split over t: "
               "P_0 = ceil(L/p) P_layer + Vh (2Vh when p = 1), P_layer = (N - 2Vh)/L, the same "
               "count on the first stage (input embedding) and the last (output layer)",
    "gradients": "gradients are 2 bytes per parameter of the stage, split over t",
    "optimizer state": "Adam's state is 12 bytes per parameter of the stage over t, "
                       "divided by the dp·cp ranks that share it under zero1 (not under ddp)",
    "activations": "under 1F1B the first stage holds min(p, m) micro-batches of ceil(L/p) "
                   "layers, the last stage one, each layer 34 s_c b h / t bytes (s_c = s/c, "
                   "TP + SP), plus the scores 5 a s_c s b / t when nothing is recomputed; full "
                   "recomputation keeps 2 s_c b h / t per layer plus one layer's 34 s_c b h / t",
    "logits": LOGITS,
}
BYTES_HINTS = {
    "tp": "TP with SP as Megatron-LM runs it: m ceil(L/p) 20 (t-1)/t b s_c h (per layer and "
          "micro-batch, four all-gathers and four reduce-scatters of a bf16 (b, s_c, h), and "
          "two all-gathers more in backward, which re-gather the sequence-sharded inputs the "
          "34 s_c b h / t of the activations keeps)",
    "cp": "CP: m ceil(L/p) (6c-4) 2 b s_c h / t (a bf16 K or V block of the rank's a/t heads: "
          "K and V c-1 hops forward and c-1 backward, dK and dV c hops, the last one home)",
    "pp": "PP: m 2 (2 b s_c h / t) (one activation forward, one gradient backward, bf16, each "
          "TP rank its 1/t)",
    "dp": "DP: one ring all-reduce of the first stage's bf16 gradients over the dp·cp ranks "
          "that hold them, 2 (D-1)/D 2 P_0 / t with D = dp·cp",
}
LINK = ("a group rides NVLink when all its ranks r share r // gpus_per_node on the grid "
        "arange(256).view(dp, pp, 1, cp, tp) (TP innermost); the DP group is the dp·cp ranks "
        "with the same pp and tp coordinates")


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(b), 1.0)


def _logits_hint(got: float, want: float, sizes: dict[str, int], microbatches: int) -> str:
    t, c = sizes.get("tp", 1), sizes.get("cp", 1)
    held = min(sizes.get("pp", 1), microbatches)
    if want == 0 and got > 0:
        return ("the logits live on the last stage, where the output layer and the loss run; "
                "the first stage of a pipeline holds only the input embedding")
    if want > 0 and got == 0:
        return LOGITS
    causes = []  # every known mistake that gives this number: two that agree are both named
    if _near(2 * got, want):
        causes.append("the logits counted in bf16 (2 bytes): the loss keeps them in fp32, 4 "
                      "bytes each (Megatron-LM casts them to float before the cross-entropy)")
    for n, what in ((t, "t"), (c, "c")):
        if n == 2 and _near(2 * got, want):
            causes.append(f"divided by {what} = 2 once too often")
    if t > 1 and _near(got, t * want):
        causes.append("the logits not split over TP: under the vocabulary-parallel "
                      "cross-entropy each TP rank keeps only its V/t columns, 4 b s_c V / t")
    if c > 1 and _near(got, c * want):
        causes.append("a CP rank keeps the logits of its own s_c = s/c tokens only")
    if held > 1 and _near(got, held * want):
        causes.append("one micro-batch's logits, not min(p, m): 1F1B's last stage runs each "
                      "micro-batch's backward right after its forward")
    if len(causes) > 1:
        return "either " + "; or ".join(causes)
    return causes[0] if causes else LOGITS


def memory_hint(part: str, got: float, want: float, *, stage: str, sizes: dict[str, int],
                microbatches: int, first_activations: float) -> str:
    """The likely mistake behind `got` where the planner says `want` (module docstring)."""
    if part == "logits":
        return _logits_hint(got, want, sizes, microbatches)
    if (part == "activations" and stage == "last" and _near(got, first_activations)
            and not _near(want, first_activations)):
        return ("the last stage charged the first stage's min(p, m) micro-batches: under "
                "1F1B it holds one in flight, starting each backward right after its forward")
    return MEMORY_HINTS[part]
