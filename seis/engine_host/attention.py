"""Which attention an engine ran, said about the baseline: E0's `auto` falls back from FlashInfer to Triton where
its process cannot import FlashInfer, and then vanilla is not mini-sglang's design. One wording for the gate report
and post-validation's notes."""
from __future__ import annotations

import importlib.util


def baseline_attention(stats: dict, device: str) -> str | None:
    """'vanilla E0's attention backend: X', with a warning where FlashInfer is installed here but vanilla ran
    something else on CUDA; None when the stats do not name a backend."""
    backend = stats.get("attention_backend") if isinstance(stats, dict) else None
    if not isinstance(backend, str):
        return None
    line = f"vanilla E0's attention backend: {backend}"
    if device.startswith("cuda") and backend != "flashinfer" and importlib.util.find_spec("flashinfer") is not None:
        line += (" although flashinfer is installed here: vanilla's engine process could not import it, so the "
                 "baseline is not mini-sglang's FlashInfer design")
    return line
