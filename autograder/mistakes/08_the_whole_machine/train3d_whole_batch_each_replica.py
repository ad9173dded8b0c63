"""Every DP replica runs the whole global batch, not its own rows (grid.batch_rows): the DP
mean of equal gradients is the single device's gradient and the loss is right at every step,
for d times the work and none of data parallelism's speed-up."""

CAUGHT_BY = {"check_train_3d": "every replica ran the whole batch"}


def train_3d(cfg, plan, steps, *, lr, make_optimizer):
    grid = make_grid(dp=plan.dp, pp=plan.pp, tp=plan.tp)  # noqa: F821
    model = ParallelLlama(Llama(cfg), grid, split_layers(cfg, plan.pp),  # noqa: F821
                          sequence_parallel=plan.sequence_parallel).to(device())  # noqa: F821
    ddp = OverlappedDDP(model.parameters(), group=grid.dp, bucket_bytes=2**14)  # noqa: F821
    opt = make_optimizer(model.parameters(), lr=lr)
    tokens, _ = load_corpus()  # noqa: F821
    pos = grid.positions(cfg.seq, sequence_parallel=plan.sequence_parallel,
                         device=device())  # noqa: F821
    b = plan.micro_batch_size
    losses = []
    for step in range(steps):
        x, y = batch(tokens, step, batch_size=plan.global_batch_size, seq=cfg.seq,  # noqa: F821
                     seed=cfg.seed)
        x, y = x.to(device()), y.to(device())  # noqa: F821  the mistake: not x[rows]
        inputs, targets = list(x.split(b)), list(y.split(b))
        schedule = make_schedule(plan.schedule, plan.pp, len(inputs))  # noqa: F821
        opt.zero_grad(set_to_none=True)
        loss = run_schedule(schedule, model, grid, inputs=inputs, targets=targets,  # noqa: F821
                            pos=pos, shape=(b, pos.sp.numel(), cfg.hidden), sync=[ddp])
        ddp.finish()
        allreduce_sequence_parallel_grads(model.sequence_parallel_params(),  # noqa: F821
                                          group=grid.tp)
        sum_grads(model.embedding_copies(), group=grid.embedding)  # noqa: F821
        opt.step()
        total = loss.detach().reshape(1).clone()
        dist.all_reduce(total, group=grid.pp)  # noqa: F821
        dist.all_reduce(total, group=grid.dp)  # noqa: F821
        losses.append(total.item() / dist.get_world_size(grid.dp))  # noqa: F821
    return losses
