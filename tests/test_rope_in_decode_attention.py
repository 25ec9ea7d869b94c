"""The `rope-in-decode-attention` library entry on CPU: given a decode step's raw q, k and v, its decode kernel, run
by Triton's interpreter, does the q/k RMSNorm, RoPE and KV write itself, and its output and both cache layers are
bitwise those of qk_norm_rope_store followed by the same kernel on the rotated q: with and without q/k norms,
float32 and bfloat16, the new row in a split's first block and in a later one, with and without tl.dot.

The check runs in a child process (tests/interpreted.py).
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from interpreted import run_interpreted  # noqa: E402
from seis.agents.offline.library import load_library  # noqa: E402
from seis.agents.offline.merge import with_prerequisites  # noqa: E402
from seis.agents.offline.verify import build_candidate  # noqa: E402

CHECK = r'''
import sys

import torch

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.attention import NewTokens
from engine.kernels.triton_attention import paged_decode
from engine.kernels.triton_ops import qk_norm_rope_store
from engine.model import rope_cache


class Layers:  # one cache layer, as qk_norm_rope_store indexes it
    def __init__(self, k, v):
        self.k, self.v = [k], [v]


g = torch.Generator().manual_seed(0)
F32, BF16 = torch.float32, torch.bfloat16
cases = 0
# (batch, q heads, kv heads, head dim, page, context lengths, splits, block_n, q/k norms, dtype, mma). With 2 splits
# the 300-token request's new row lies past its split's first block; tl.dot only in float32 (the interpreter's bf16
# tl.dot is not faithful, and not needed: both sides run the same one).
for bs, hq, hk, d, page, lens, splits, block_n, norm, dtype, mma in [
        (1, 16, 8, 128, 16, [100], 32, 16, True, BF16, False), (3, 4, 2, 64, 4, [1, 37, 130], 8, 32, True, F32, False),
        (2, 6, 2, 32, 8, [5, 300], 2, 16, True, F32, True), (2, 6, 2, 32, 8, [5, 300], 2, 16, False, BF16, False),
        (2, 4, 2, 16, 2, [16, 17], 2, 16, False, F32, True)]:
    slots = 4096
    k_cache = torch.randn(slots, hk, d, generator=g).to(dtype)
    v_cache = torch.randn(slots, hk, d, generator=g).to(dtype)
    qkv = torch.randn(bs, (hq + 2 * hk) * d, generator=g).to(dtype)
    q = qkv[:, : hq * d].view(bs, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].view(bs, hk, d)
    v = qkv[:, (hq + hk) * d:].view(bs, hk, d)
    qw, kw = ((1 + 0.1 * torch.randn(d, generator=g)).to(dtype) if norm else None for _ in range(2))
    width = max(lens) // page + 2
    page_table = torch.randperm(slots // page - 1, generator=g)[: bs * width].view(bs, width).to(torch.int32) + 1
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    pos = seq_lens.long() - 1
    out_slots = page_table.long()[torch.arange(bs), pos // page] * page + pos % page
    cos_sin = rope_cache(d, 1e6, 512, torch.device("cpu"))

    def scratch():
        return torch.empty(bs, hq, splits, d), torch.empty(bs, hq, splits), torch.zeros(bs * hk, dtype=torch.int32)

    want_k, want_v, want = k_cache.clone(), v_cache.clone(), torch.empty_like(q)
    # q.clone(): without norms qk_norm_rope_store rotates q in place
    q_rot = qk_norm_rope_store(q.clone(), k, v, qw, kw, 1e-6, pos, cos_sin, Layers(want_k, want_v), 0, out_slots)
    paged_decode(q_rot, want_k, want_v, page_table, seq_lens, want, *scratch(), page, block_n=block_n, mma=mma)
    got, (mid_out, mid_lse, counters) = torch.empty_like(q), scratch()
    paged_decode(q, k_cache, v_cache, page_table, seq_lens, got, mid_out, mid_lse, counters, page, block_n=block_n,
                 mma=mma, new=NewTokens(k, v, qw, kw, 1e-6, pos, cos_sin, out_slots))
    what = f"{bs} {hq}/{hk} d{d} lens {lens} splits {splits} norm={norm} {dtype} mma={mma}"
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), what
    assert torch.equal(got, want), f"{what}: max abs diff {(got.float() - want.float()).abs().max().item()}"
    assert int(counters.abs().sum()) == 0, f"{what}: counters left {counters.tolist()}"
    cases += 1
print(f"cases {cases}")
'''


@pytest.mark.slow
def test_decode_kernel_with_the_new_tokens_equals_norm_rope_store_then_decode(tmp_path):
    t = next(t for t in load_library() if t.name == "rope-in-decode-attention")
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    assert "cases 5" in run_interpreted(CHECK, candidate, tmp_path)
