"""Seeded random-weight models in HF format, built from a state dict with torch directly.

Instantiating the HF model would be slow and memory hungry for the 0.6B; instead every tensor is
generated from its own generator (seed + crc32(name)), so the bytes are identical on every run and
any single tensor can be regenerated in isolation.
"""
from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

from . import tokenizer as tok

SEED = 0
# Embedding / lm_head std = EMBED_SCALE / sqrt(hidden): with unit-RMS final hidden states the logits then
# have std ~EMBED_SCALE, i.e. a peaked, non-flat next-token distribution.
EMBED_SCALE = 4.0


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _special_ids() -> dict[str, Any]:
    return {"bos_token_id": tok.ENDOFTEXT_ID, "eos_token_id": tok.EOS_TOKEN_IDS, "pad_token_id": tok.ENDOFTEXT_ID}


def qwen3_config(*, hidden_size: int, intermediate_size: int, num_hidden_layers: int, num_attention_heads: int,
                 num_key_value_heads: int, head_dim: int, vocab_size: int, max_position_embeddings: int,
                 rope_theta: float, tie_word_embeddings: bool, torch_dtype: str) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
        "max_window_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_hidden_layers": num_hidden_layers,
        "num_key_value_heads": num_key_value_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": tie_word_embeddings,
        "torch_dtype": torch_dtype,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
        **_special_ids(),
    }


def qwen3_0_6b_config() -> dict[str, Any]:
    """Qwen3-0.6B's config.json, except the special-token ids, which point into our byte tokenizer."""
    return qwen3_config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                        rope_theta=1000000, tie_word_embeddings=True, torch_dtype="bfloat16")


def tiny_qwen3_config() -> dict[str, Any]:
    return qwen3_config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, vocab_size=_round_up(tok.TOKENIZER_SIZE, 64),
                        max_position_embeddings=512, rope_theta=1000000, tie_word_embeddings=False,
                        torch_dtype="float32")


def tiny_llama_config() -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 160,
        "max_position_embeddings": 512,
        "mlp_bias": False,
        "num_attention_heads": 4,
        "num_hidden_layers": 3,
        "num_key_value_heads": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": _round_up(tok.TOKENIZER_SIZE, 64),
        **_special_ids(),
    }


def param_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes of a Llama/Qwen3 causal LM (Qwen3 adds per-head q/k norms)."""
    h, inter, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_out, kv_out = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q_out, h),
            p + "self_attn.k_proj.weight": (kv_out, h),
            p + "self_attn.v_proj.weight": (kv_out, h),
            p + "self_attn.o_proj.weight": (h, q_out),
        }
        if config["model_type"] == "qwen3":
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
        shapes |= {
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    shapes["model.norm.weight"] = (h,)
    if not config["tie_word_embeddings"]:  # tied => HF reuses embed_tokens, no lm_head in the file
        shapes["lm_head.weight"] = (config["vocab_size"], h)
    return shapes


def init_tensor(name: str, shape: tuple[int, ...], *, hidden_size: int, dtype: str, seed: int = SEED):
    """One parameter, deterministic in (name, shape, seed): norms 1, embeddings/lm_head N(0, 4/sqrt(hidden)),
    linears N(0, 1/sqrt(fan_in)).

    Fan-in scaling (0.018-0.031 for the 0.6B, i.e. about the usual 0.02) keeps every layer's contribution to the
    residual stream comparable to the embedding. A flat 0.02 would make the hidden-64 models' layers ~20x weaker
    than their embeddings, so their logits would barely depend on context and attention/KV-cache bugs would hide.
    """
    import torch

    target = getattr(torch, dtype)
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=target)
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        std = EMBED_SCALE / math.sqrt(hidden_size)
    else:
        std = 1.0 / math.sqrt(shape[1])  # nn.Linear weight is (out_features, in_features)
    gen = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
    # Sample in fp32 and cast, so the values do not depend on dtype-specific sampling kernels.
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen).to(target)


def write_random_model(out_dir: Path, config: dict[str, Any], seed: int = SEED) -> None:
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tensors = {name: init_tensor(name, shape, hidden_size=config["hidden_size"], dtype=config["torch_dtype"],
                                 seed=seed)
               for name, shape in param_shapes(config).items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    del tensors
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", {**_special_ids()})
    tok.save_byte_tokenizer(out_dir, model_max_length=config["max_position_embeddings"])


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_qwen3_0_6b(out_dir: Path) -> None:
    write_random_model(out_dir, qwen3_0_6b_config())


def build_tiny_qwen3(out_dir: Path) -> None:
    write_random_model(out_dir, tiny_qwen3_config())


def build_tiny_llama(out_dir: Path) -> None:
    write_random_model(out_dir, tiny_llama_config())
