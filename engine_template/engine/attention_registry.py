"""The attention backends by name, and the choice of one for an engine (`EngineOptions.attention_backend`).

auto: FlashInfer on CUDA when it imports and fits (half precision, head_dim 64/128/256), else Triton on CUDA when
it imports, else torch.
"""
from __future__ import annotations

from typing import Callable

from .attention import TorchAttention, TritonAttention
from .attention_backend import AttentionBackend, AttentionConfig
from .flashinfer_attention import FLASHINFER_DTYPES, FLASHINFER_HEAD_DIMS, FlashInferAttention


class BackendUnfit(ValueError):
    """A backend cannot run this config (device, dtype, head size): asked for by name, an error; under auto, the
    next backend is tried."""


def _torch(config: AttentionConfig) -> AttentionBackend:
    return TorchAttention(config.num_heads, config.num_kv_heads, config.head_dim)


def _triton(config: AttentionConfig) -> AttentionBackend:
    _require_cuda("triton", config)
    import triton  # noqa: F401  (the kernel module imports it only at the first decode: fail at build instead)
    return TritonAttention(config.num_heads, config.num_kv_heads, config.head_dim, config.max_batch_size,
                           config.device)


def _flashinfer(config: AttentionConfig) -> AttentionBackend:
    _require_cuda("flashinfer", config)
    if config.dtype not in FLASHINFER_DTYPES:
        raise BackendUnfit(f"the flashinfer attention backend needs bfloat16 or float16, not {config.dtype}")
    if config.head_dim not in FLASHINFER_HEAD_DIMS:
        raise BackendUnfit(f"the flashinfer attention backend supports head_dim {FLASHINFER_HEAD_DIMS}, "
                           f"not {config.head_dim}")
    return FlashInferAttention(config.num_heads, config.num_kv_heads, config.head_dim, config.page_size,
                               config.max_pages_per_request, config.dtype, config.device)


def _require_cuda(name: str, config: AttentionConfig) -> None:
    if config.device.type != "cuda":
        raise BackendUnfit(f"the {name} attention backend needs a CUDA device")


# name -> factory; a factory raises BackendUnfit when the config does not suit it and ImportError when its package
# is missing
ATTENTION_BACKENDS: dict[str, Callable[[AttentionConfig], AttentionBackend]] = {
    "torch": _torch,
    "triton": _triton,
    "flashinfer": _flashinfer,
}
AUTO_ORDER = ("flashinfer", "triton", "torch")  # fastest first; torch fits every config, so auto always ends


def select_backend(requested: str, config: AttentionConfig) -> AttentionBackend:
    """The backend named `requested`, or under "auto" the first of AUTO_ORDER that fits and imports."""
    if requested == "auto":
        for name in AUTO_ORDER:
            try:
                return ATTENTION_BACKENDS[name](config)
            except (BackendUnfit, ImportError):
                continue
    if requested not in ATTENTION_BACKENDS:
        *others, last = ATTENTION_BACKENDS
        raise ValueError(f"unknown attention backend {requested!r} (choose auto, {', '.join(others)} or {last})")
    return ATTENTION_BACKENDS[requested](config)
