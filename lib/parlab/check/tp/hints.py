"""The likely-mistake sentences of module 02's checks, one per mistake we can foresee; a check
names one as `hints.<NAME>` where it reports that mistake."""

F_BACKWARD = ("f's backward must all-reduce: each rank's column shard adds only its own part "
              "of dL/dx, and the true gradient is the sum over ranks")
G_BACKWARD = ("g's backward must be the identity: g's output is the same on every rank, so "
              "every rank already holds the whole gradient; an all-reduce there sums t copies")
EXTRA_F = ("the weight gradients are right but the input's is t times too large: it was "
           "all-reduced twice, so f is applied twice. ColumnParallelLinear already applies f to "
           "its input; do not call f again before it")
EXTRA_G = ("the output was all-reduced twice: RowParallelLinear already applies g to the "
           "partial products, and a second g sums t copies of the finished output. Return "
           "self.fc2(...) as it is")
BIAS_ONCE = ("the bias is added on every rank before the all-reduce, so it is counted t times: "
             "add it once, after the all-reduce")
ROW_FIRST = ("row-parallel first needs an all-reduce before the GeLU (GeLU of partial sums is "
             "not GeLU of the sum) and another collective after fc2: make fc1 column-parallel "
             "and fc2 row-parallel, which needs one all-reduce in forward and one in backward")
LINEAR_LAYOUT = ("nn.Linear.weight has shape (out_features, in_features): the column-parallel "
                 "layer keeps a block of ROWS of linear.weight (dim 0, its output features) and "
                 "the row-parallel layer a block of its COLUMNS (dim 1, its input features)")
OWN_COPY = ("a shard must own its memory: nn.Parameter(linear.weight.detach()[rows].clone()); "
            "without .clone() the slice is a view that keeps the whole weight alive on every "
            "rank, which is the memory tensor parallelism is meant to save")
IN_PLACE = ("work on a copy (x.clone()) or out-of-place operations (x = x + y, not x += y): "
            "the caller's tensor must not change")
HANG = ("a collective that only some ranks call (inside `if rank == ...`), or ranks calling "
        "different collectives: every rank must make the same calls in the same order")
REPLICATED = "return the whole output, replicated on every rank"
GRAD_HINT = ("the forward is right but this gradient is not, so look at the backward of f and g "
             "(check_f_g tests them alone): f's backward all-reduces, g's passes the gradient "
             "through")
SIZE_FROM_LAYER = ("the shard's size comes from the layer it is given (linear.out_features // t "
                   "rows for the column layer, linear.in_features // t columns for the row "
                   "layer), never a fixed number: the checks use layers of other sizes")
