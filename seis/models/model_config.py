"""A model directory's config.json, read in one place: the shape facts SEIS needs (vocabulary, context, layers,
KV heads) with the Hugging Face defaults spelled out once."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ModelError


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    max_position_embeddings: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    tie_word_embeddings: bool
    torch_dtype: str | None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one context token, summed over layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


def read_model_config(model_dir: str | Path, default_context: int = 2048) -> ModelConfig:
    """The model's config.json; `default_context` stands in for a missing max_position_embeddings."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read {path}: {e}") from None
    try:
        heads = int(raw.get("num_attention_heads") or 1)
        hidden = int(raw.get("hidden_size") or 0)
        return ModelConfig(
            vocab_size=int(raw["vocab_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings") or default_context),
            num_hidden_layers=int(raw.get("num_hidden_layers") or 0), num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or (hidden // heads if hidden else 0)), hidden_size=hidden,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"), raw=raw)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelError(f"{path} lacks a usable {e} entry") from None
