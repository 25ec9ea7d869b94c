"""Small Triton kernels for the fused primitives: one launch each, as vanilla engines have them."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(X, Y, W, stride_xt, stride_xh, stride_yt, stride_yh, N, eps, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + t * stride_xt + h * stride_xh + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    y = (x * rstd).to(Y.dtype.element_ty).to(tl.float32) * w
    tl.store(Y + t * stride_yt + h * stride_yh + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _add_rmsnorm_kernel(X, R, W, stride_x, stride_r, N, eps, BLOCK: tl.constexpr):
    # In place: R <- X + R (rounded to the model dtype, as an unfused add would be); X <- rmsnorm(R).
    t = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + t * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + t * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(R.dtype.element_ty)
    tl.store(R + t * stride_r + offs, s, mask=mask)
    s = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=0) / N + eps)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    y = (s * rstd).to(X.dtype.element_ty).to(tl.float32) * w
    tl.store(X + t * stride_x + offs, y.to(X.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_kernel(X, Y, stride_x, stride_y, N, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    gate = tl.load(X + t * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + t * stride_x + N + offs, mask=mask, other=0.0).to(tl.float32)
    act = (gate * tl.sigmoid(gate)).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + t * stride_y + offs, (act * up).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(POS, Q, K, CS, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
                 NUM_Q: tl.constexpr, HALF: tl.constexpr):
    # In place on q and k; one program rotates one head of one token.
    t = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(POS + t)
    offs = tl.arange(0, HALF)
    cos = tl.load(CS + pos * stride_cs + offs)
    sin = tl.load(CS + pos * stride_cs + HALF + offs)
    if h < NUM_Q:
        base = Q + t * stride_qt + h * stride_qh
    else:
        base = K + t * stride_kt + (h - NUM_Q) * stride_kh
    x1 = tl.load(base + offs).to(tl.float32)
    x2 = tl.load(base + HALF + offs).to(tl.float32)
    tl.store(base + offs, (x1 * cos - x2 * sin).to(Q.dtype.element_ty))
    tl.store(base + HALF + offs, (x2 * cos + x1 * sin).to(Q.dtype.element_ty))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, N] or [T, H, N] (per-head norm, as Qwen3's q/k norm); the last dim must be contiguous."""
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    y3 = torch.empty(x3.shape, dtype=x.dtype, device=x.device)
    n = x3.shape[-1]
    _rmsnorm_kernel[(x3.shape[0], x3.shape[1])](
        x3, y3, weight, x3.stride(0), x3.stride(1), y3.stride(0), y3.stride(1), n, eps,
        BLOCK=triton.next_power_of_2(n))
    return y3.view(x.shape)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    n = x.shape[-1]
    _add_rmsnorm_kernel[(x.shape[0],)](x, residual, weight, x.stride(0), residual.stride(0), n, eps,
                                       BLOCK=triton.next_power_of_2(n))
    return x, residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1] // 2
    y = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    block = 1024
    _silu_and_mul_kernel[(x.shape[0], triton.cdiv(n, block))](x, y, x.stride(0), y.stride(0), n, BLOCK=block)
    return y


def rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor):
    tokens, num_q, head_dim = q.shape
    _rope_kernel[(tokens, num_q + k.shape[1])](
        positions, q, k, cos_sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin.stride(0),
        NUM_Q=num_q, HALF=head_dim // 2)
    return q, k
