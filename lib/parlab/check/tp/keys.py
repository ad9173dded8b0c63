"""The keys of module 02's exercises for `parlab.check.exercise`, and what a later check builds
on: a check whose prerequisite has not passed says which exercise to do first."""

KEY_F_G, KEY_LINEARS, KEY_MLP = "02.f_g", "02.linears", "02.tp_mlp"
KEY_ROW_FIRST, KEY_ATTENTION, KEY_BLOCK = "02.row_first", "02.tp_attention", "02.tp_block"
F_G = {KEY_F_G: "f and g (exercise 1)"}
LINEARS = {**F_G, KEY_LINEARS: "ColumnParallelLinear and RowParallelLinear (exercise 2)"}
LAYERS = {**LINEARS, KEY_MLP: "TPMLP (exercise 3)", KEY_ATTENTION: "TPAttention (exercise 5)"}
