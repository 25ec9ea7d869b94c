"""The `attention-qk-prologue` library entry on CPU: the split-KV decode kernel with NewTokens, run by Triton's
interpreter, does qk_norm_rope_store's work in its prologue. Its attention output and both cache layers must equal,
bit for bit, fused-qk-rope-store's kernel followed by fused-decode-attention's: fp32 and bf16, with and without
Qwen3's q/k norms, GQA groups 1 to 2, the new position in a split's first block and in a later one, on the CUDA cores
and with tl.dot.

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
from engine.attention_backend import NewTokens
from engine.kernels.triton_attention import paged_decode
from engine.kernels.triton_ops import qk_norm_rope_store
from engine.model import rope_cache


class Cache:  # the two arguments of kv that qk_norm_rope_store reads
    def __init__(self, k, v):
        self.k, self.v = [k], [v]


g = torch.Generator().manual_seed(0)
cases = 0
F32, BF16 = torch.float32, torch.bfloat16
# (batch, q heads, kv heads, head dim, page, context lengths, splits, block_n, q/k norms, dtype, mma). The lengths
# put a request's new position in a split's first block and in a later one, and in the last row of a page.
for bs, hq, hk, d, page, lens, splits, block_n, norm, dtype, mma in [
        (1, 16, 8, 128, 16, [100], 32, 16, True, BF16, False), (3, 4, 2, 64, 4, [1, 37, 130], 2, 16, True, F32, False),
        (2, 6, 2, 32, 8, [5, 300], 4, 16, False, BF16, False), (2, 3, 3, 16, 2, [9, 64], 2, 16, True, F32, True)]:
    slots = 4096
    projected = torch.randn(bs, (hq + 2 * hk) * d, generator=g).to(dtype)
    qw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype) if norm else None
    kw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype) if norm else None
    cos_sin = rope_cache(d, 10000.0, 512, torch.device("cpu"))
    width = max(lens) // page + 2
    pt = torch.randperm(slots // page - 1, generator=g)[: bs * width].view(bs, width).to(torch.int32) + 1
    seq = torch.tensor(lens, dtype=torch.int32)
    pos = seq.long() - 1
    out_slots = pt.long().gather(1, (pos // page)[:, None])[:, 0] * page + pos % page
    caches = torch.randn(2, slots, hk, d, generator=g).to(dtype)
    outs = []
    for fused in (False, True):
        qkv = projected.clone()  # without q/k norms qk_norm_rope_store rotates q in place
        q = qkv[:, : hq * d].view(bs, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(bs, hk, d)
        v = qkv[:, (hq + hk) * d :].view(bs, hk, d)
        kc, vc = caches[0].clone(), caches[1].clone()
        out = torch.empty(bs, hq, d, dtype=dtype)
        counters = torch.zeros(bs * hk, dtype=torch.int32)
        scratch = torch.empty(bs, hq, splits, d), torch.empty(bs, hq, splits)
        if fused:
            paged_decode(q, kc, vc, pt, seq, out, *scratch, counters, page, block_n=block_n, mma=mma,
                         prologue=NewTokens(q, k, v, qw, kw, 1e-6, pos, cos_sin, out_slots))
        else:
            qn = qk_norm_rope_store(q, k, v, qw, kw, 1e-6, pos, cos_sin, Cache(kc, vc), 0, out_slots)
            paged_decode(qn, kc, vc, pt, seq, out, *scratch, counters, page, block_n=block_n, mma=mma)
        assert int(counters.abs().sum()) == 0
        outs.append((out, kc, vc))
    (o0, k0, v0), (o1, k1, v1) = outs
    assert torch.equal(k0, k1) and torch.equal(v0, v1), "caches differ"
    assert torch.equal(o0, o1), f"outputs differ by {(o0.float() - o1.float()).abs().max()}"
    cases += 1
print(f"cases {cases}")
'''


@pytest.mark.slow
def test_the_prologue_equals_the_two_kernels_it_replaces(tmp_path):
    t = next(t for t in load_library() if t.name == "attention-qk-prologue")
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    assert "cases 4" in run_interpreted(CHECK, candidate, tmp_path)
