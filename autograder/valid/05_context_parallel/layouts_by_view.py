"""The striped and zigzag positions read off the arange of the whole sequence viewed as a
grid: striped as column `rank` of (n, W), zigzag as rows rank and 2W - 1 - rank of (2W, n/2),
instead of aranges with steps and a cat."""

PASSES = ["check_layouts"]


def layout_positions(layout, rank, world_size, seq_len):
    n = seq_len // world_size
    positions = torch.arange(seq_len)  # noqa: F821
    if layout == "contiguous":
        return positions.view(world_size, n)[rank].clone()
    if layout == "striped":
        return positions.view(n, world_size)[:, rank].contiguous()
    if layout == "zigzag":
        rows = positions.view(2 * world_size, n // 2)
        return rows[[rank, 2 * world_size - 1 - rank]].reshape(-1)
    raise ValueError(f"unknown layout {layout!r}")
