"""The first stage gets L // p layers: right when p divides L, short of the fullest stage when
it does not (80 layers over 32 stages: 2 instead of 3)."""

CAUGHT_BY = {"check_plan_70b": "P_0 = ceil(L/p) P_layer + Vh"}


def _first_stage(model, sizes):
    p = sizes.get("pp", 1)
    layers = model.layers // p  # the mistake: floor, not ceil
    embed = model.vocab * model.hidden
    per_layer = (model.n_params - 2 * embed) / model.layers
    return layers, layers * per_layer + embed * (2 if p == 1 else 1)
