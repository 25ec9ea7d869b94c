"""Fused primitives behind one small interface, chosen once per engine.

`torch` runs anywhere; `triton` is used on CUDA devices when Triton imports.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Ops:
    name: str
    module: ModuleType

    def __getattr__(self, item):  # rmsnorm, add_rmsnorm, silu_and_mul, rope
        return getattr(self.module, item)


def select_ops(device_type: str, preferred: str = "auto") -> Ops:
    if preferred not in ("auto", "torch", "triton"):
        raise ValueError(f"unknown kernel backend {preferred!r} (choose auto, torch or triton)")
    if preferred == "triton" or (preferred == "auto" and device_type == "cuda"):
        if device_type != "cuda":
            raise ValueError("the triton kernel backend needs a CUDA device")
        try:
            from . import triton_ops
            return Ops("triton", triton_ops)
        except ImportError:
            if preferred == "triton":
                raise
    from . import torch_ops
    return Ops("torch", torch_ops)
