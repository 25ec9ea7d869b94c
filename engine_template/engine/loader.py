"""Load HF safetensors into the engine's layout (QKV and gate-up merged at load time)."""
from __future__ import annotations

from pathlib import Path

import torch

from .config import ModelConfig


def load_weights(model_dir: Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"model dir {model_dir} has no *.safetensors files")
    raw: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                raw[_strip(name)] = f.get_tensor(name)

    def take(name: str) -> torch.Tensor:
        if name not in raw:
            raise ValueError(f"model dir {model_dir}: weight {name!r} is missing")
        return raw.pop(name).to(device=device, dtype=dtype)

    out = {"embed_tokens": take("embed_tokens.weight"), "norm": take("norm.weight")}
    if "lm_head.weight" in raw and not cfg.tie_word_embeddings:
        out["lm_head"] = take("lm_head.weight")
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        layer = {
            "input_layernorm": take(p + "input_layernorm.weight"),
            "post_attention_layernorm": take(p + "post_attention_layernorm.weight"),
            "qkv_proj": torch.cat([take(attn + f"{x}_proj.weight") for x in "qkv"]),
            "o_proj": take(attn + "o_proj.weight"),
            "gate_up_proj": torch.cat([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")]),
            "down_proj": take(mlp + "down_proj.weight"),
        }
        if cfg.attention_bias:
            layer["qkv_bias"] = torch.cat([take(attn + f"{x}_proj.bias") for x in "qkv"])
        if cfg.qk_norm:
            layer["q_norm"] = take(attn + "q_norm.weight")
            layer["k_norm"] = take(attn + "k_norm.weight")
        out.update({p + k: v for k, v in layer.items()})
    _check_shapes(out, cfg)
    return out


def _strip(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


def _check_shapes(w: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    expect = {
        "embed_tokens": (cfg.vocab_size, cfg.hidden_size),
        "layers.0.qkv_proj": (cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size),
        "layers.0.gate_up_proj": (2 * cfg.intermediate_size, cfg.hidden_size),
    }
    for name, shape in expect.items():
        if tuple(w[name].shape) != shape:
            raise ValueError(f"weight {name} has shape {tuple(w[name].shape)}, config implies {shape}")
