"""Decoder-only transformer covering Qwen3 (q/k norm) and Llama, in sglang's layout:
merged QKV and gate-up projections, fused add-RMSNorm, in-place RoPE, SiLU-and-mul, paged attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention_backend import AttentionBackend
from .batch import ForwardBatch
from .config import ModelConfig
from .kernels import Ops
from .kv_cache import KVCache


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], ops: Ops, index: int):
        self.cfg, self.ops, self.index = cfg, ops, index
        self.input_norm = weights["input_layernorm"]
        self.post_attn_norm = weights["post_attention_layernorm"]
        self.qkv = weights["qkv_proj"]
        self.qkv_bias = weights.get("qkv_bias")
        self.o_proj = weights["o_proj"]
        self.q_norm = weights.get("q_norm")
        self.k_norm = weights.get("k_norm")
        self.gate_up = weights["gate_up_proj"]
        self.down = weights["down_proj"]

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch,
                attn: AttentionBackend, kv: KVCache, cos_sin: torch.Tensor):
        cfg, ops = self.cfg, self.ops
        if residual is None:
            residual = hidden
            hidden = ops.rmsnorm(hidden, self.input_norm, cfg.rms_norm_eps)
        else:
            hidden, residual = ops.add_rmsnorm(hidden, residual, self.input_norm, cfg.rms_norm_eps)

        qkv = F.linear(hidden, self.qkv, self.qkv_bias)
        tokens = qkv.shape[0]
        q = qkv[:, : cfg.q_size].view(tokens, cfg.num_heads, cfg.head_dim)
        k = qkv[:, cfg.q_size : cfg.q_size + cfg.kv_size].view(tokens, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, cfg.q_size + cfg.kv_size :].view(tokens, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None:
            q = ops.rmsnorm(q, self.q_norm, cfg.rms_norm_eps)
            k = ops.rmsnorm(k, self.k_norm, cfg.rms_norm_eps)
        q, k = ops.rope(batch.positions, q, k, cos_sin)
        kv.store(self.index, batch.out_slots, k, v)
        attn_out = attn.forward(self.index, q, batch, kv)
        hidden = F.linear(attn_out, self.o_proj)

        hidden, residual = ops.add_rmsnorm(hidden, residual, self.post_attn_norm, cfg.rms_norm_eps)
        hidden = F.linear(ops.silu_and_mul(F.linear(hidden, self.gate_up)), self.down)
        return hidden, residual


class CausalLM:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], ops: Ops, max_positions: int):
        self.cfg, self.ops = cfg, ops
        self.embed = weights["embed_tokens"]
        self.norm = weights["norm"]
        self.lm_head = weights.get("lm_head", self.embed)
        self.layers = [DecoderLayer(cfg, _layer_weights(weights, i), ops, i) for i in range(cfg.num_layers)]
        self.cos_sin = rope_cache(cfg.head_dim, cfg.rope_theta, max_positions, self.embed.device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend, kv: KVCache) -> torch.Tensor:
        """Returns logits (float32) for `batch.logit_rows`."""
        hidden = F.embedding(batch.input_ids, self.embed)
        residual = None
        for layer in self.layers:
            hidden, residual = layer.forward(hidden, residual, batch, attn, kv, self.cos_sin)
        hidden, _ = self.ops.add_rmsnorm(hidden, residual, self.norm, self.cfg.rms_norm_eps)
        return F.linear(hidden.index_select(0, batch.logit_rows), self.lm_head).float()


def rope_cache(head_dim: int, theta: float, max_positions: int, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos of the half-dim frequencies, then sin (computed as HF does)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


def _layer_weights(weights: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    prefix = f"layers.{i}."
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
