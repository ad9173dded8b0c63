"""The intensities and the placement written with other algebra: TP's intensity as the int
`h` itself, DP's as 3 * n_tokens (6N FLOPs over 2 bytes, simplified), the headroom as
offered * bandwidth / compute rate instead of offered / (compute rate / bandwidth), and the
verdict as a comparison of what is offered with what is required. The same numbers up to
rounding, and the verdict of 'headroom >= 1' by the exercise's definition."""

PASSES = ["check_intensities", "check_placement"]


def tp_intensity(h):
    return h


def dp_intensity(n_tokens):
    return 3 * n_tokens


def link_requirement(flops_per_s, bytes_per_s):
    return flops_per_s / bytes_per_s


def placement(h, n_tokens, flops_per_s, bytes_per_s):
    required = link_requirement(flops_per_s, bytes_per_s)
    out = {}
    for name, offered in {"tp": tp_intensity(h), "dp": dp_intensity(n_tokens)}.items():
        out[name] = {"compute_bound": offered >= required,
                     "headroom": offered * bytes_per_s / flops_per_s}
    return out
