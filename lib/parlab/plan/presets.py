"""Models and clusters for the planner (`parlab.plan`): module 07's problems and published runs.

Bandwidths are bytes/s per GPU, ONE direction (NVLink datasheets quote both directions added).

- `PRACTICE_70B` on `H100_32`: module 07's practice problem 1, a 70B dense model on 32 H100
  80 GB, 8 per node. The problem gives only the parameter count; layers 80, hidden 8192, 64
  heads, sequence 4096 are Llama 2 70B's (Touvron et al. 2023, arXiv:2307.09288); the
  vocabulary is left out as the problem does (16 B/param of state). Batch 1024 sequences (4M
  tokens, Llama 2's). `SEED_70B` is its earlier name, kept for code written against it.
- `MODEL_512` on `H100_512`: module 07's quiz, 512 H100 in 64 nodes as TP 8 × PP 8 × DP 8.
  The quiz names no model. Megatron-Turing NLG 530B (Smith et al. 2022, arXiv:2201.11990: 105
  layers, hidden 20480, 128 heads, sequence 2048, global batch 1920; GPT-2's BPE vocabulary,
  50257) was trained that way, TP 8 inside a node and PP (35) across nodes, on A100s.
  Smaller models (GPT-3 175B) rank TP 4 first here: their state fits, and TP 4 sends 3/7 of
  TP 8's bytes.
- `LLAMA3_405B` on `LLAMA3_CLUSTER`: Llama 3 405B (Dubey et al. 2024, "The Llama 3 Herd of
  Models", arXiv:2407.21783): 126 layers, width 16384, 128 heads (8 KV heads), vocabulary
  128256 (the released config), pre-trained at sequence 8192 with 16M-token batches (2048
  sequences) on up to 16,384 H100 80 GB, 8 per server on NVLink, 400 Gb/s RoCE per GPU; its
  table 4 runs 16,384 GPUs as TP 8, CP 1, PP 16, DP 128.
- `MEGATRON_1T` on `MEGATRON_CLUSTER`: the 1T GPT of Narayanan et al. 2021 ("Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473,
  table 1): 128 layers, hidden 25600, 160 heads, sequence 2048, vocabulary 51200, batch 3072,
  on 3072 A100 80 GB (Selene: DGX A100 nodes, NVLink 3 at 600 GB/s both directions, eight
  200 Gb/s HDR InfiniBand adapters per node), run as TP 8 × PP 64 × DP 6; A100 bf16 peak
  312 TFLOP/s.
- `DEEPSEEK_V3` on `DEEPSEEK_CLUSTER` (an MoE): DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437):
  671B parameters, 37B active, 61 layers (the first 3 dense), hidden 7168, 128 heads, 256
  routed experts of width 2048 per MoE layer, 8 per token, sequence 4096, batch 15360;
  trained on 2048 H800 with PP 16, EP 64 over 8 nodes, ZeRO-1 DP and no TP; the report
  quotes 160 GB/s NVLink and 50 GB/s InfiniBand per GPU. Its attention is MLA, which the
  planner's activation formula does not model.

NVLink domains of 72 (`GB200_NVL72`, `GB200_NVL72_512`, `GB200_RACKS`): NVIDIA's GB200 NVL72
rack joins 72 Blackwell GPUs by NVLink 5 through NVLink switches, 1.8 TB/s per GPU counting
both directions, so 900 GB/s each way (`intra_bw`), against H100's 450; 186 GB and 2.5 PFLOP/s
of dense bf16 per GPU (`parlab.costs.hardware`, from NVIDIA's GB200 NVL72 datasheet); one
400 Gb/s InfiniBand NIC per GPU between racks, as for H100. One rack as one domain is
`GB200_NVL72`: a group stays on NVLink when its size divides 72 (8, 24, 36, 72). Power-of-two
groups of 16, 32 or 64 do not divide 72, so a run that wants TP 16 or EP 64 inside a rack uses
64 of its 72 GPUs and leaves 8 idle (or as spares): `GB200_NVL72_512` is 8 such racks, 512
GPUs in NVLink domains of 64, to set beside `H100_512` (64 nodes of 8). `GB200_RACKS` is the
same GB200 GPUs with NVLink cut at 8, a cluster no one sells: it keeps the GPU and changes only
the domain, to tell the domain's effect from the GPU's. The product with NVLink domains of 8
is `HGX_B200_512`, 64 HGX B200 nodes: NVLink 5 inside a node, but its B200s have 180 GB and
2.25 PFLOP/s dense (NVIDIA's HGX B200 datasheet), less than a GB200's.

Runs that use the schedule and the CP variant of modules 04 and 05 (`PUBLISHED_VARIANTS`):
- DeepSeek-V3's PP 16 × EP 64 × DP 2 ran DualPipe (arXiv:2412.19437, section 3.2.1), which
  overlaps each forward chunk with a backward chunk so that the EP all-to-alls hide under
  compute. The planner prices DualPipe-V, its one-direction form in the DualPipe repository
  (same bubble and activations per device, one copy of the weights instead of two).
- Llama 3 405B's long-context phase (arXiv:2407.21783, table 4): 16,384 GPUs as TP 8 × CP 16
  × PP 16 × DP 8 at 131,072 tokens, 16M tokens per batch, 380 TFLOP/s per GPU (38% BF16
  MFU). Its 8 key/value heads leave one per TP rank, so Ulysses cannot split them 16 ways:
  the planner rejects Ulysses there and keeps the ring (Llama 3's own CP exchanges K and V).
- Ulysses in print: DeepSpeed-Ulysses (Jacobs et al., arXiv:2309.14509) trains a 1.3B GPT at
  32K tokens on 8 A100 with Ulysses degree 4 and scales a 1.2B GPT to 1M tokens on 64 A100;
  USP (Fang and Zhao, arXiv:2405.07719) reports 47% MFU for Llama 3 8B at 208K tokens on two
  8 x A800 nodes, Ulysses inside a node and a ring across. Their head counts and clusters are
  not all published, so they are cited, not priced.
"""

from __future__ import annotations

import dataclasses

from parlab import costs
from parlab.costs import hardware
from parlab.plan.types import Cluster, Model

_NVLINK4 = costs.NVLINK_PER_DIRECTION_BYTES_PER_S  # 450e9: 900 GB/s counts both directions
_NIC = costs.NIC_400G_BYTES_PER_S  # 50e9: one 400 Gb/s NIC per GPU

PRACTICE_70B = Model("70B dense (practice problem 1)", 70e9, layers=80, hidden=8192, heads=64,
                     seq=4096)
SEED_70B = PRACTICE_70B  # the earlier name
H100_32 = Cluster("32 × H100 80 GB (4 nodes)", gpus=32, gpus_per_node=8, memory=80e9,
                  intra_bw=_NVLINK4, inter_bw=_NIC, flops=costs.H100_BF16_FLOPS)
MODEL_512 = Model("MT-NLG 530B", 530e9, layers=105, hidden=20480, heads=128, seq=2048,
                  vocab=50257)
H100_512 = Cluster("512 × H100 80 GB (64 nodes)", gpus=512, gpus_per_node=8, memory=80e9,
                   intra_bw=_NVLINK4, inter_bw=_NIC, flops=costs.H100_BF16_FLOPS)
LLAMA3_405B = Model("Llama 3 405B", 405e9, layers=126, hidden=16384, heads=128, seq=8192,
                    vocab=128256, kv_heads=8)
LLAMA3_405B_LONG = Model("Llama 3 405B, 128K context", 405e9, layers=126, hidden=16384,
                         heads=128, seq=131072, vocab=128256, kv_heads=8)
LLAMA3_CLUSTER = Cluster("16,384 × H100 80 GB (Llama 3)", gpus=16384, gpus_per_node=8,
                         memory=costs.H100_MEMORY_BYTES, intra_bw=_NVLINK4, inter_bw=_NIC,
                         flops=costs.H100_BF16_FLOPS, inter_name="RoCE")
MEGATRON_1T = Model("GPT 1T (Megatron-LM)", 1008e9, layers=128, hidden=25600, heads=160,
                    seq=2048, vocab=51200)
MEGATRON_CLUSTER = Cluster("3,072 × A100 80 GB (Selene)", gpus=3072, gpus_per_node=8,
                           memory=hardware.A100_MEMORY_BYTES, intra_bw=300e9, inter_bw=25e9,
                           flops=costs.A100_BF16_FLOPS)
DEEPSEEK_V3 = Model("DeepSeek-V3", 671e9, layers=61, hidden=7168, heads=128, seq=4096,
                    vocab=129280, experts=256, top_k=8, moe_layers=58,
                    expert_params=58 * 256 * 3 * 7168 * 2048)  # 58 layers × 256 SwiGLU experts
DEEPSEEK_CLUSTER = Cluster("2,048 × H800 80 GB (DeepSeek-V3)", gpus=2048, gpus_per_node=8,
                           memory=hardware.H800_MEMORY_BYTES, intra_bw=160e9, inter_bw=_NIC,
                            flops=costs.H800_BF16_FLOPS)
_NVLINK5 = 900e9  # GB200 NVL72: 1.8 TB/s per GPU counts both directions
GB200_NVL72 = Cluster("72 × GB200 (one NVL72 rack)", gpus=72, gpus_per_node=72,
                      memory=costs.GB200_MEMORY_BYTES, intra_bw=_NVLINK5, inter_bw=_NIC,
                      flops=costs.GB200_BF16_FLOPS)
GB200_NVL72_512 = dataclasses.replace(GB200_NVL72, gpus=512, gpus_per_node=64,
                                      name="512 × GB200 (8 NVL72 racks, 64 GPUs of each)")
GB200_RACKS = dataclasses.replace(GB200_NVL72_512, gpus_per_node=8,
                                  name="512 × GB200 (NVLink cut to nodes of 8)")
HGX_B200_512 = Cluster("512 × B200 (64 HGX B200 nodes)", gpus=512, gpus_per_node=8,
                       memory=costs.HGX_B200_MEMORY_BYTES, intra_bw=_NVLINK5, inter_bw=_NIC,
                       flops=costs.HGX_B200_BF16_FLOPS)

PRESETS: dict[str, tuple[Model, Cluster, int]] = {
    "70B on 32 H100 (practice problem 1)": (PRACTICE_70B, H100_32, 1024),
    "MT-NLG 530B on 512 H100 (the TP 8 × PP 8 × DP 8 quiz)": (MODEL_512, H100_512, 1920),
    "Llama 3 405B on 16,384 H100": (LLAMA3_405B, LLAMA3_CLUSTER, 2048),
    "GPT 1T on 3,072 A100 (Megatron-LM)": (MEGATRON_1T, MEGATRON_CLUSTER, 3072),
    "DeepSeek-V3 on 2,048 H800 (MoE)": (DEEPSEEK_V3, DEEPSEEK_CLUSTER, 15360),
    "Llama 3 405B on 512 GB200 (8 NVL72 racks)": (LLAMA3_405B, GB200_NVL72_512, 1024),
}
"""Name → (model, cluster, global batch in sequences), for the widget and the notebook."""

PUBLISHED: dict[str, tuple[dict[str, int], str]] = {
    "Llama 3 405B on 16,384 H100": (
        {"tp": 8, "pp": 16, "dp": 128},
        "38-43% BF16 (Dubey et al. 2024, arXiv:2407.21783, table 4)"),
    "GPT 1T on 3,072 A100 (Megatron-LM)": (
        {"tp": 8, "pp": 64, "dp": 6},
        "52% of peak, 163 TFLOP/s (Narayanan et al. 2021, arXiv:2104.04473, table 1), counting "
        "the recomputed forward: about 39% without it"),
}
"""Preset name -> (the run's published plan, the MFU it reports). Megatron-LM counts
96·B·s·l·h² FLOPs per step, the recomputed forward included (72 without), so its 52% is
52% · 72/96 = 39% in the 6N count this course calls MFU (`parlab.plan.Plan.mfu`)."""

PUBLISHED_VARIANTS: dict[str, tuple[Model, Cluster, int, dict[str, int | str], str]] = {
    "DeepSeek-V3 on 2,048 H800 (DualPipe)": (
        DEEPSEEK_V3, DEEPSEEK_CLUSTER, 15360,
        {"pp": 16, "ep": 64, "dp": 2, "schedule": "dualpipe_v"},
        "DualPipe with PP 16, EP 64 over 8 nodes, ZeRO-1 DP (arXiv:2412.19437, 3.2.1)"),
    "Llama 3 405B at 128K tokens on 16,384 H100": (
        LLAMA3_405B_LONG, LLAMA3_CLUSTER, 128,
        {"tp": 8, "cp": 16, "pp": 16, "dp": 8, "cp_kind": "ring"},
        "TP 8 x CP 16 x PP 16 x DP 8, 38% BF16 MFU (arXiv:2407.21783, table 4)"),
}
"""Name -> (model, cluster, global batch in sequences, the published plan with the schedule or
CP variant the planner prices it by, what the source reports); see the module docstring."""
