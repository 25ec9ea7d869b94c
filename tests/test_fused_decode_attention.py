"""The `fused-decode-attention` library entry on CPU: its one-launch split-KV kernel, run by Triton's interpreter,
computes paged decode attention (checked against an fp32 softmax over each request's gathered pages), leaves its
counters at zero after every launch, and agrees with E0's two-launch kernel. `fused-rope-decode-attention`, which
also does the q/k norm, RoPE and KV write inside that kernel, equals fused-qk-rope-store's kernel followed by it.

The check runs in a child process (tests/interpreted.py).
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from interpreted import run_interpreted  # noqa: E402
from seis.agents.offline.library import load_library  # noqa: E402
from seis.agents.offline.verify import build_candidate  # noqa: E402

CHECK = r'''
import importlib.util
import sys

import torch

from seis.engine_import import ENGINE_TEMPLATE, import_engine

spec = importlib.util.spec_from_file_location("e0_attention", ENGINE_TEMPLATE / "engine/kernels/triton_attention.py")
e0 = importlib.util.module_from_spec(spec)
sys.modules["e0_attention"] = e0  # triton's jit reads the kernel's source through the module
spec.loader.exec_module(e0)

import_engine(sys.argv[1])
from engine.kernels.triton_attention import paged_decode  # the candidate's


def reference(q, k, v, page_table, lens, page):
    out = []
    for b, length in enumerate(lens):
        slots = (page_table[b].long()[:, None] * page + torch.arange(page)).flatten()[:length]
        group = q.shape[1] // k.shape[1]
        kk = k[slots].float().repeat_interleave(group, 1)
        vv = v[slots].float().repeat_interleave(group, 1)
        scores = torch.einsum("hd,lhd->hl", q[b].float(), kk) * q.shape[-1] ** -0.5
        out.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), vv))
    return torch.stack(out)


g = torch.Generator().manual_seed(0)
cases = 0
# (batch, q heads, kv heads, head dim, page, context lengths, splits, block_n)
for bs, hq, hk, d, page, lens, splits, block_n in [
        (1, 16, 8, 128, 16, [100], 32, 32), (3, 4, 2, 64, 4, [1, 37, 130], 8, 32), (2, 6, 2, 32, 8, [5, 300], 16, 16),
        (2, 3, 3, 16, 2, [9, 2], 2, 64), (2, 6, 2, 16, 4, [64, 65], 4, 16)]:
    for dtype in (torch.float32, torch.bfloat16):
        slots = 4096
        k = torch.randn(slots, hk, d, generator=g).to(dtype)
        v = torch.randn(slots, hk, d, generator=g).to(dtype)
        q = torch.randn(bs, hq, d, generator=g).to(dtype)
        width = max(lens) // page + 2
        pt = torch.randperm(slots // page - 1, generator=g)[: bs * width].view(bs, width).to(torch.int32) + 1
        seq = torch.tensor(lens, dtype=torch.int32)
        want = reference(q, k, v, pt, lens, page)
        counters = torch.zeros(bs * hk + 3, dtype=torch.int32)
        for launch in range(2):  # the second launch relies on the first having reset the counters
            out = torch.empty_like(q)
            mid_out, mid_lse = torch.empty(bs, hq, splits, d), torch.empty(bs, hq, splits)
            paged_decode(q, k, v, pt, seq, out, mid_out, mid_lse, counters, page, block_n=block_n)
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            err = (out.float() - want).abs().max().item()
            assert err < tol, f"{bs} {hq}/{hk} d{d} page {page} lens {lens} {dtype}: max abs error {err}"
            assert int(counters.abs().sum()) == 0, f"counters left {counters.tolist()}"
        e0_out = torch.empty_like(q)
        e0.paged_decode(q, k, v, pt, seq, e0_out, torch.empty(bs, hq, 8, d), torch.empty(bs, hq, 8), page)
        assert (e0_out.float() - out.float()).abs().max().item() < 2 * tol
        cases += 1
print(f"cases {cases}")
'''


def test_one_launch_decode_attention_matches_reference(tmp_path):
    t = next(t for t in load_library() if t.name == "fused-decode-attention")
    candidate = build_candidate(tmp_path / "candidate", [t])
    assert "cases 10" in run_interpreted(CHECK, candidate, tmp_path)


ROPE_CHECK = r"""
import sys

import torch

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.kernels import triton_ops
from engine.kernels.triton_attention import RopeInputs, paged_decode


class OneLayerCache:  # the part of KVCache that qk_norm_rope_store uses
    def __init__(self, k, v):
        self.k, self.v = [k], [v]


g = torch.Generator().manual_seed(0)
cases = 0
# (batch, q heads, kv heads, head dim, page, context lengths, splits, block_n, q/k norm)
for bs, hq, hk, d, page, lens, splits, block_n, norm in [
        (1, 16, 8, 128, 16, [100], 32, 16, True), (3, 6, 2, 64, 4, [1, 37, 130], 8, 32, True),
        (2, 6, 2, 32, 8, [5, 300], 16, 16, False)]:
    for dtype in (torch.float32, torch.bfloat16):
        k_cache = torch.randn(4096, hk, d, generator=g).to(dtype)
        v_cache = torch.randn(4096, hk, d, generator=g).to(dtype)
        qkv = torch.randn(bs, (hq + 2 * hk) * d, generator=g).to(dtype) * 3  # the raw QKV projection output
        q, k, v = (qkv[:, a * d : b * d].view(bs, -1, d) for a, b in ((0, hq), (hq, hq + hk), (hq + hk, hq + 2 * hk)))
        qw, kw = ((torch.rand(d, generator=g) + 0.5).to(dtype) if norm else None for _ in range(2))
        width = max(lens) // page + 2
        pt = torch.randperm(4096 // page - 1, generator=g)[: bs * width].view(bs, width).to(torch.int32) + 1
        seq = torch.tensor(lens, dtype=torch.int32)
        pos = seq.long() - 1
        slots = pt.long().gather(1, (pos // page)[:, None])[:, 0] * page + pos % page
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        angles = torch.arange(512).float()[:, None] * inv[None]
        cos_sin = torch.cat((angles.cos(), angles.sin()), -1)
        counters = torch.zeros(bs * hk, dtype=torch.int32)

        def scratch():
            return torch.empty(bs, hq, splits, d), torch.empty(bs, hq, splits)

        # the two launches it replaces: fused-qk-rope-store's kernel, then the decode kernel on its q
        two = OneLayerCache(k_cache.clone(), v_cache.clone())
        # (a copy of q: without q/k norms that kernel rotates q in place)
        q_rot = triton_ops.qk_norm_rope_store(q.clone(), k, v, qw, kw, 1e-6, pos, cos_sin, two, 0, slots)
        want = torch.empty(bs, hq, d, dtype=dtype)
        paged_decode(q_rot, two.k[0], two.v[0], pt, seq, want, *scratch(), counters, page, block_n=block_n)
        k_one, v_one, raw = k_cache.clone(), v_cache.clone(), qkv.clone()
        for launch in range(2):  # the second launch relies on the first having reset the counters
            out = torch.empty(bs, hq, d, dtype=dtype)
            paged_decode(q, k_one, v_one, pt, seq, out, *scratch(), counters, page, block_n=block_n,
                         rope=RopeInputs(k, v, qw, kw, 1e-6, pos, slots, cos_sin))
            case = f"{bs} {hq}/{hk} d{d} lens {lens} {dtype} norm {norm}"
            assert torch.equal(out, want), f"{case}: output differs by {(out.float() - want.float()).abs().max()}"
            assert torch.equal(k_one, two.k[0]) and torch.equal(v_one, two.v[0]), f"{case}: caches differ"
            assert torch.equal(qkv, raw), f"{case}: the QKV output changed"
            assert int(counters.abs().sum()) == 0, f"counters left {counters.tolist()}"
        cases += 1
print(f"cases {cases}")
"""


def test_rope_inside_the_kernel_equals_the_separate_launch(tmp_path):
    t = next(t for t in load_library() if t.name == "fused-rope-decode-attention")
    candidate = build_candidate(tmp_path / "candidate", [t])
    assert "cases 6" in run_interpreted(ROPE_CHECK, candidate, tmp_path)
