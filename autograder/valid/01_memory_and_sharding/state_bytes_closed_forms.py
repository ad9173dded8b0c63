"""state_bytes from one closed form per strategy, 16P for DDP down to 16P/d for ZeRO-3 and
FSDP, with the practice problem's verdicts from a strict comparison the other way round."""

PASSES = ["check_state_bytes"]


def state_bytes(n_params, strategy, dp):
    forms = {"ddp": 16 * n_params, "zero1": 4 * n_params + 12 * n_params / dp,
             "zero2": 2 * n_params + 14 * n_params / dp, "zero3": 16 * n_params / dp}
    return forms["zero3" if strategy == "fsdp" else strategy]


practice = {"ddp_per_gpu": state_bytes(70e9, "ddp", 32),
            "zero3_per_gpu": state_bytes(70e9, "zero3", 32)}
practice["ddp_fits"] = not practice["ddp_per_gpu"] > 80e9
practice["zero3_fits"] = not practice["zero3_per_gpu"] > 80e9
