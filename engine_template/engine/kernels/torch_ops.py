"""Portable torch implementations of the fused primitives (CPU, or GPU without Triton).

Rounding follows Hugging Face's modules (normalize in float32, cast, then scale by the weight) so float32 runs
match the reference to within accumulation-order noise.
"""
from __future__ import annotations

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """Returns (rmsnorm(x + residual), x + residual)."""
    residual = x + residual
    return rmsnorm(residual, weight, eps), residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor):
    """Neox-style rotary embedding. q: [T, Hq, D], k: [T, Hk, D]; cos_sin: [max_pos, D] (cos | sin halves)."""
    half = q.shape[-1] // 2
    cs = cos_sin.index_select(0, positions)
    cos = cs[:, None, :half].repeat(1, 1, 2).to(q.dtype)
    sin = cs[:, None, half:].repeat(1, 1, 2).to(q.dtype)
    return _rotate(q, cos, sin, half), _rotate(k, cos, sin, half)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
