"""Paged decode attention in Triton: split the KV range, then merge the partial softmaxes (flash-decoding)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_partial(Q, K, V, PT, SEQ, MID_O, MID_LSE, sm_scale,
                    stride_qb, stride_qh, stride_ks, stride_kh, stride_pt,
                    stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    kvh = h // GROUP
    seq_len = tl.load(SEQ + b)
    split_len = tl.cdiv(seq_len, NUM_SPLITS)
    start = s * split_len
    end = tl.minimum(start + split_len, seq_len)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d).to(tl.float32) * sm_scale
    m = -float("inf")
    l = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        valid = offs_n < end
        page = tl.load(PT + b * stride_pt + offs_n // PAGE, mask=valid, other=0)
        slot = page.to(tl.int64) * PAGE + offs_n % PAGE
        kv_off = slot[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :]
        k = tl.load(K + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
        scores = tl.where(valid, tl.sum(q[None, :] * k, axis=1), -float("inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(V + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_new
    has = end > start
    out = tl.where(has, acc / tl.where(has, l, 1.0), 0.0)
    tl.store(MID_O + b * stride_mb + h * stride_mh + s * stride_ms + offs_d, out)
    tl.store(MID_LSE + b * stride_lb + h * stride_lh + s, tl.where(has, m + tl.log(l), -float("inf")))


@triton.jit
def _decode_merge(MID_O, MID_LSE, O, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh, stride_ob, stride_oh,
                  HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    lse = tl.load(MID_LSE + b * stride_lb + h * stride_lh + offs_s)
    w = tl.exp(lse - tl.max(lse, axis=0))
    parts = tl.load(MID_O + b * stride_mb + h * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :])
    out = tl.sum(parts * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                 seq_lens: torch.Tensor, out: torch.Tensor, mid_out: torch.Tensor, mid_lse: torch.Tensor,
                 page_size: int) -> None:
    """q, out: [B, Hq, D]; k_cache, v_cache: [slots, Hk, D]; page_table: [B, W]; seq_lens: [B] (>= 1)."""
    bs, num_heads, head_dim = q.shape
    num_splits = mid_out.shape[2]
    group = num_heads // k_cache.shape[1]
    _decode_partial[(bs, num_heads, num_splits)](
        q, k_cache, v_cache, page_table, seq_lens, mid_out, mid_lse, head_dim ** -0.5,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), page_table.stride(0),
        mid_out.stride(0), mid_out.stride(1), mid_out.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, PAGE=page_size, HEAD_DIM=head_dim, BLOCK_N=64, NUM_SPLITS=num_splits)
    _decode_merge[(bs, num_heads)](
        mid_out, mid_lse, out, mid_out.stride(0), mid_out.stride(1), mid_out.stride(2),
        mid_lse.stride(0), mid_lse.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, NUM_SPLITS=num_splits)
