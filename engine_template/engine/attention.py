"""The torch and Triton attention backends (see attention_backend.py for the interface they implement).

TorchAttention's SDPA paths run on any device; TritonAttention replaces only its decode step with a Triton kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention_backend import AttentionBackend
from .batch import ForwardBatch
from .kv_cache import KVCache


class TorchAttention(AttentionBackend):
    """Portable path (CPU and GPU): gathers each request's pages and calls SDPA."""

    name = "torch"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def plan(self, batch: ForwardBatch) -> None:
        """Host-side preparation before a step (outside any captured graph); this backend needs none."""

    def forward(self, layer: int, q: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        if batch.is_decode:
            return self.decode(layer, q, batch, kv)
        return self.extend(layer, q, batch, kv)

    def extend(self, layer: int, q: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        out = torch.empty_like(q)
        start = 0
        for i, (ext, seq_len) in enumerate(zip(batch.extend_lens, batch.seq_lens_host)):
            slots = _slots(batch.page_table[i : i + 1], kv.page_size)[0, :seq_len]
            k, v = kv.k[layer].index_select(0, slots), kv.v[layer].index_select(0, slots)
            if ext == seq_len:  # no cached prefix: plain causal, which SDPA runs as flash attention (no L x L mask)
                mask, causal = None, True
            else:  # rows after a cached prefix: causal offset by the prefix
                q_pos = torch.arange(seq_len - ext, seq_len, device=q.device)
                mask, causal = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None], False
            # 4-D [1, H, L, D]: SDPA's fused kernels refuse 3-D inputs and would fall back to L x L scores.
            o = F.scaled_dot_product_attention(
                q[start : start + ext].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                attn_mask=mask, is_causal=causal, enable_gqa=True)
            out[start : start + ext] = o[0].transpose(0, 1)
            start += ext
        return out.flatten(1)

    def decode(self, layer: int, q: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        slots = _slots(batch.page_table, kv.page_size)                       # [B, L]
        k, v = _gather(kv.k[layer], slots), _gather(kv.v[layer], slots)       # [B, L, Hk, D]
        mask = torch.arange(slots.shape[1], device=q.device)[None, :] < batch.seq_lens[:, None]
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None, None, :], enable_gqa=True)
        return o.flatten(1)


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    # index_select: plain advanced indexing is orders of magnitude slower on CPU for this shape
    return cache.index_select(0, slots.flatten()).view(*slots.shape, *cache.shape[1:])


def _slots(page_table: torch.Tensor, page_size: int) -> torch.Tensor:
    offsets = torch.arange(page_size, device=page_table.device, dtype=torch.int64)
    return (page_table.long()[:, :, None] * page_size + offsets).flatten(1)


class TritonAttention(TorchAttention):
    """Split-KV paged decode kernel in Triton; extend steps use the SDPA path."""

    name = "triton"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, max_batch_size: int, device: torch.device,
                 num_splits: int = 8):
        super().__init__(num_heads, num_kv_heads, head_dim)
        self.num_splits = num_splits
        # Scratch for the two-stage reduction; allocated once so CUDA graphs see fixed addresses.
        self.mid_out = torch.empty((max_batch_size, num_heads, num_splits, head_dim), dtype=torch.float32, device=device)
        self.mid_lse = torch.empty((max_batch_size, num_heads, num_splits), dtype=torch.float32, device=device)

    def decode(self, layer: int, q: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        from .kernels.triton_attention import paged_decode
        out = torch.empty_like(q)
        bs = q.shape[0]
        paged_decode(q, kv.k[layer], kv.v[layer], batch.page_table, batch.seq_lens, out,
                     self.mid_out[:bs], self.mid_lse[:bs], kv.page_size)
        return out.flatten(1)

