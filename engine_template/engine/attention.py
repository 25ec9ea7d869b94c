"""Paged attention behind one interface.

K/V of the new tokens are already in the cache when `forward` runs, so every backend reads keys and values
only through the page table.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .batch import ForwardBatch
from .kv_cache import KVCache


class TorchAttention:
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


FLASHINFER_HEAD_DIMS = (64, 128, 256)  # what its decode and merge kernels are built for


def select_attention(preferred: str, device: torch.device, dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                     head_dim: int, max_batch_size: int, page_size: int, max_pages_per_request: int
                     ) -> TorchAttention:
    """auto: FlashInfer on CUDA when it imports and the dtype is half precision, else Triton, else torch."""
    if preferred not in ("auto", "torch", "triton", "flashinfer"):
        raise ValueError(f"unknown attention backend {preferred!r} (choose auto, torch, triton or flashinfer)")
    if preferred in ("triton", "flashinfer") and device.type != "cuda":
        raise ValueError(f"the {preferred} attention backend needs a CUDA device")
    if preferred == "flashinfer" and dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"the flashinfer attention backend needs bfloat16 or float16, not {dtype}")
    if preferred == "flashinfer" and head_dim not in FLASHINFER_HEAD_DIMS:
        raise ValueError(f"the flashinfer attention backend supports head_dim {FLASHINFER_HEAD_DIMS}, not {head_dim}")
    fits_flashinfer = head_dim in FLASHINFER_HEAD_DIMS and dtype in (torch.bfloat16, torch.float16)
    if preferred == "flashinfer" or (preferred == "auto" and device.type == "cuda" and fits_flashinfer):
        try:
            from .flashinfer_attention import FlashInferAttention
            return FlashInferAttention(num_heads, num_kv_heads, head_dim, page_size, max_pages_per_request, dtype,
                                       device)
        except ImportError:
            if preferred == "flashinfer":
                raise
    if preferred == "triton" or (preferred == "auto" and device.type == "cuda"):
        try:
            import triton  # noqa: F401
            return TritonAttention(num_heads, num_kv_heads, head_dim, max_batch_size, device)
        except ImportError:
            if preferred == "triton":
                raise
    return TorchAttention(num_heads, num_kv_heads, head_dim)
