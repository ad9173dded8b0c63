"""Nothing is split: every rank trains the whole model on the whole batch. The loss equals
the single device's exactly, which is why the check also looks at the communication."""

CAUGHT_BY = {"check_train_3d": "no communication over this rank's DP group"}
SIZES = {"check_train_3d": (8,)}


def train_3d(cfg, plan, steps, *, lr, make_optimizer):
    model = Llama(cfg)  # noqa: F821  the mistake: the whole model on every rank
    opt = make_optimizer(model.parameters(), lr=lr)
    tokens, _ = load_corpus()  # noqa: F821
    losses = []
    for step in range(steps):
        x, y = batch(tokens, step, batch_size=plan.global_batch_size, seq=cfg.seq,  # noqa: F821
                     seed=cfg.seed)
        opt.zero_grad()
        loss = Llama.loss(model(x), y)  # noqa: F821
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
