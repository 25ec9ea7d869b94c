"""Random bf16 weights of Qwen3-0.6B's decoder layers for the kernel benchmarks that time a layer's projections:
one set per layer, so 28 layers in one CUDA graph stream W from memory as a decode step does."""
from __future__ import annotations

import torch

HIDDEN, INTERMEDIATE, Q_OUT, QKV_OUT, LAYERS = 1024, 3072, 2048, 4096, 28


def random_layers(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> list[dict[str, torch.Tensor]]:
    """LAYERS dicts of qkv, o, gate_up, down ([N, K], F.linear's layout) and the two norm weights."""
    def rnd(*shape):
        return torch.randn(*shape, device=device, dtype=dtype) * 0.02

    return [{"qkv": rnd(QKV_OUT, HIDDEN), "o": rnd(HIDDEN, Q_OUT), "gate_up": rnd(2 * INTERMEDIATE, HIDDEN),
             "down": rnd(HIDDEN, INTERMEDIATE),
             "norm1": torch.rand(HIDDEN, device=device, dtype=dtype) + 0.5,
             "norm2": torch.rand(HIDDEN, device=device, dtype=dtype) + 0.5} for _ in range(LAYERS)]
