"""What the model and the decode CUDA graphs ask of an attention backend, and what every backend is built from.

Backends: `attention.py` (torch SDPA; Triton split-KV decode), `flashinfer_attention.py` (FlashInfer).
`attention_registry.py` names them and picks one for an engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .batch import ForwardBatch
from .kv_cache import KVCache


class AttentionBackend(Protocol):
    """Paged attention over the KV cache.

    K/V of the new tokens are already in the cache when `forward` runs, so a backend reads keys and values only
    through the page table.
    """

    name: str  # its registry name, reported by Engine.stats()

    def plan(self, batch: ForwardBatch) -> None:
        """Host-side preparation before a step. Runs outside any captured graph, before every replay, so it may
        only write into buffers that a graph captured."""

    def forward(self, layer: int, q: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """q: [T, num_heads, head_dim], the step's new tokens; returns [T, num_heads * head_dim]."""


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """The model's attention shape and the engine's limits, fixed at build."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    max_batch_size: int            # rows of a decode step (sizes scratch that CUDA graphs capture)
    page_size: int
    max_pages_per_request: int     # columns of the page table
