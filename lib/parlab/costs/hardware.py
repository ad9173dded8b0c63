r"""One constant per card: the figures of a GPU the course uses, each with its source.

Peak FLOP/s are dense (no 2:4 sparsity) bf16 Tensor Core rates; NVIDIA's datasheets print the
sparse figure, twice the dense one, with a footnote. Memory is what the product gives a GPU, in
decimal bytes. Every notebook, widget, preset and check reads these names; none types a card's
number again (tests/test_costs.py greps lib/ and the notebooks for the old literals).

| card            | dense bf16 FLOP/s | memory | source (NVIDIA's datasheets)                     |
|-----------------|-------------------|--------|--------------------------------------------------|
| H100 SXM 80 GB  | 989.4e12          | 80e9   | 1,979 TFLOPS sparse; 989.4 dense (whitepaper)    |
| H800 SXM 80 GB  | 989.4e12          | 80e9   | the H100's SXM die; NVLink cut to 400 GB/s       |
| H200 SXM 141 GB | 989.4e12          | 141e9  | 1,979 TFLOPS BF16 with sparsity, 141 GB HBM3e    |
| A100 SXM 80 GB  | 312e12            | 80e9   | 312 TFLOPS BF16 dense (624 with sparsity)        |
| GB200 (NVL72)   | 2.5e15            | 186e9  | 360 PFLOPS sparse and 13.4 TB HBM3e for 72 GPUs  |
| B200 (HGX B200) | 2.25e15           | 180e9  | 36 PFLOPS sparse and 1,440 GB HBM3e for 8 GPUs   |

The GB200's B200 runs at a higher power than the HGX B200's (1,200 W against 1,000 W), hence
the two rates; NVIDIA's B200 chip carries 192 GB, of which the products expose 186 and 180.
"""

from __future__ import annotations

__all__ = ["H100_BF16_FLOPS", "H800_BF16_FLOPS", "H200_BF16_FLOPS", "A100_BF16_FLOPS",
           "GB200_BF16_FLOPS", "HGX_B200_BF16_FLOPS", "H100_MEMORY_BYTES", "H800_MEMORY_BYTES",
           "H200_MEMORY_BYTES", "A100_MEMORY_BYTES", "A100_40GB_MEMORY_BYTES",
           "GB200_MEMORY_BYTES", "HGX_B200_MEMORY_BYTES", "CARDS"]

H100_BF16_FLOPS = 989.4e12  # H100 SXM: 1,979 TFLOPS sparse (datasheet), 989.4 dense
H800_BF16_FLOPS = H100_BF16_FLOPS  # the same SXM die; only its NVLink differs
H200_BF16_FLOPS = H100_BF16_FLOPS  # H200 datasheet: 1,979 TFLOPS BF16 with sparsity
A100_BF16_FLOPS = 312e12  # A100 datasheet: 312 TFLOPS BF16 dense, 624 with sparsity
GB200_BF16_FLOPS = 2.5e15  # GB200 NVL72 datasheet: 360 PFLOPS sparse / 72 GPUs / 2
HGX_B200_BF16_FLOPS = 2.25e15  # HGX B200 datasheet: 36 PFLOPS sparse / 8 GPUs / 2

H100_MEMORY_BYTES = 80e9  # H100 SXM: 80 GB HBM3
H800_MEMORY_BYTES = 80e9  # H800 SXM: 80 GB HBM3
H200_MEMORY_BYTES = 141e9  # H200 SXM: 141 GB HBM3e
A100_MEMORY_BYTES = 80e9  # A100 SXM 80 GB
A100_40GB_MEMORY_BYTES = 40e9  # A100 40 GB
GB200_MEMORY_BYTES = 186e9  # GB200 NVL72: 13.4 TB HBM3e / 72 GPUs
HGX_B200_MEMORY_BYTES = 180e9  # HGX B200: 1,440 GB HBM3e / 8 GPUs

CARDS: dict[str, tuple[float, float]] = {
    "A100 40 GB": (A100_BF16_FLOPS, A100_40GB_MEMORY_BYTES),
    "A100 80 GB": (A100_BF16_FLOPS, A100_MEMORY_BYTES),
    "H100 80 GB": (H100_BF16_FLOPS, H100_MEMORY_BYTES),
    "H800 80 GB": (H800_BF16_FLOPS, H800_MEMORY_BYTES),
    "H200 141 GB": (H200_BF16_FLOPS, H200_MEMORY_BYTES),
    "B200 180 GB (HGX)": (HGX_B200_BF16_FLOPS, HGX_B200_MEMORY_BYTES),
    "GB200 186 GB (NVL72)": (GB200_BF16_FLOPS, GB200_MEMORY_BYTES),
}
"""Name -> (dense bf16 FLOP/s, memory bytes), in the order widgets list them."""
