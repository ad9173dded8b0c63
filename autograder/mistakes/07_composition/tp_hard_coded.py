"""Mistake: the DP rank computed with TP hard-coded to 2 (rank // 2): right on the DP 2 × TP 2
grid of the first run, wrong on DP 4 × TP 1 (the visible SGD run), where ranks 0 and 1 both
take DP rank 0's rows, and on DP 1 × TP 4 (hidden), where every rank is DP rank 0.

Replaces train_dp_tp (the capstone exercise)."""

# ruff: noqa: F821 - the names come from the notebook's imports cell

CAUGHT_BY = {"check_capstone": "DP 4 × TP 1"}


def train_dp_tp(cfg, steps, *, dp, tp, batch_size, lr, progress_file=None):
    groups = build_groups({"dp": dp, "tp": tp})
    dp_rank = dist.get_rank() // 2  # the mistake: TP hard-coded to 2
    model = GPT(cfg).to(device())
    model.blocks = nn.ModuleList(TPBlock.from_block(blk, group=groups["tp"])
                                 for blk in model.blocks)
    opt = make_optimizer(model, lr)
    tokens, _ = load_corpus()
    rows = slice(dp_rank * (batch_size // dp), (dp_rank + 1) * (batch_size // dp))
    losses = []
    for step in range(steps):
        x, y = batch(tokens, step, batch_size=batch_size, seq=cfg.seq, seed=cfg.seed)
        x, y = x[rows], y[rows]  # (B/dp, T) each: this DP rank's share
        x, y = x.to(device()), y.to(device())
        opt.zero_grad()
        loss = GPT.loss(model(x), y)  # mean over this rank's tokens
        loss.backward()  # TP's all-reduces run inside the blocks
        sync_gradients(model, groups["dp"])
        opt.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean, group=groups["dp"])
        losses.append(mean.item() / dp)
        if progress_file is not None and dist.get_rank() == 0:
            record_progress(progress_file, step, losses[-1])
    return losses
