"""Model configuration read from a Hugging Face `config.json`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "LlamaForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3 normalizes q and k per head before RoPE
    attention_bias: bool
    eos_token_ids: tuple[int, ...]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> "ModelConfig":
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        if not path.is_file():
            raise ValueError(f"model dir {model_dir} has no config.json")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        return cls.from_dict(raw, _eos_from_generation_config(model_dir), source=str(path))

    @classmethod
    def from_dict(cls, raw: dict, extra_eos: tuple[int, ...] = (), source: str = "config") -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"{source}: architectures {archs} not supported (supported: {SUPPORTED_ARCHITECTURES})")
        if raw.get("rope_scaling"):
            raise ValueError(f"{source}: rope_scaling is not supported by this engine")
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            cfg = cls(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(_rope_theta(raw)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qk_norm=arch == "Qwen3ForCausalLM",
                attention_bias=bool(raw.get("attention_bias", False)),
                eos_token_ids=tuple(dict.fromkeys(_as_ids(raw.get("eos_token_id")) + extra_eos)),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"{source}: missing or malformed field {e}") from e
        if min(cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) <= 0:
            raise ValueError(f"{source}: sizes must be positive")
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError(f"{source}: num_attention_heads must be a multiple of num_key_value_heads")
        return cfg


def _rope_theta(raw: dict) -> float:
    # transformers 5 moved rope_theta into rope_parameters; accept both spellings.
    params = raw.get("rope_parameters") or {}
    if params.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {params['rope_type']!r} is not supported by this engine")
    return raw.get("rope_theta") or params.get("rope_theta") or 10000.0


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _eos_from_generation_config(model_dir: Path) -> tuple[int, ...]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        return _as_ids(json.loads(path.read_text()).get("eos_token_id"))
    except (json.JSONDecodeError, TypeError, ValueError):
        return ()
