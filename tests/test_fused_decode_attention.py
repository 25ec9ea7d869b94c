"""The `fused-decode-attention` library entry on CPU: its one-launch split-KV kernel, run by Triton's interpreter,
computes paged decode attention (checked against an fp32 softmax over each request's gathered pages), leaves its
counters at zero after every launch, and agrees with E0's two-launch kernel, also for the rows of one request in a
speculative verify step. The float32 cases run both ways of computing a block: on the CUDA cores and with tl.dot
(the tensor-core variant; the interpreter's tl.dot is not faithful for bf16, which the GPU checks cover).

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
# (batch, q heads, kv heads, head dim, page, context lengths, splits, block_n, rows of one request, dtype); the
# two shared ones are speculative verify steps: rows of one request (one page-table row) at consecutive lengths.
# One dtype per case, both dtypes over the cases: every launch costs the interpreter dearly.
F32, BF16 = torch.float32, torch.bfloat16
for bs, hq, hk, d, page, lens, splits, block_n, shared, dtype in [
        (1, 16, 8, 128, 16, [100], 32, 32, False, BF16), (3, 4, 2, 64, 4, [1, 37, 130], 8, 32, False, F32),
        (2, 6, 2, 32, 8, [5, 300], 16, 16, False, BF16), (2, 3, 3, 16, 2, [9, 2], 2, 64, False, F32),
        (2, 6, 2, 16, 4, [64, 65], 4, 16, False, BF16), (8, 4, 2, 64, 16, list(range(93, 101)), 8, 16, True, F32),
        (3, 4, 2, 64, 4, [1, 2, 3], 8, 16, True, BF16)]:
    slots = 4096
    k = torch.randn(slots, hk, d, generator=g).to(dtype)
    v = torch.randn(slots, hk, d, generator=g).to(dtype)
    q = torch.randn(bs, hq, d, generator=g).to(dtype)
    width = max(lens) // page + 2
    pt = torch.randperm(slots // page - 1, generator=g)[: bs * width].view(bs, width).to(torch.int32) + 1
    if shared:
        pt = pt[:1].expand(bs, width).contiguous()
    seq = torch.tensor(lens, dtype=torch.int32)
    want = reference(q, k, v, pt, lens, page)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    e0_out = torch.empty_like(q)
    e0.paged_decode(q, k, v, pt, seq, e0_out, torch.empty(bs, hq, 8, d), torch.empty(bs, hq, 8), page)
    for mma in (False, True) if dtype == F32 else (False,):
        # the next launch (the next layer, the next step) starts from these counters: zero, as this one found them
        counters = torch.zeros(bs * hk + 3, dtype=torch.int32)
        out = torch.empty_like(q)
        mid_out, mid_lse = torch.empty(bs, hq, splits, d), torch.empty(bs, hq, splits)
        paged_decode(q, k, v, pt, seq, out, mid_out, mid_lse, counters, page, block_n=block_n, mma=mma)
        err = (out.float() - want).abs().max().item()
        assert err < tol, f"{bs} {hq}/{hk} d{d} page {page} lens {lens} {dtype} mma={mma}: max abs error {err}"
        assert int(counters.abs().sum()) == 0, f"counters left {counters.tolist()}"
        assert (e0_out.float() - out.float()).abs().max().item() < 2 * tol
        cases += 1
print(f"cases {cases}")
'''


@pytest.mark.slow
def test_one_launch_decode_attention_matches_reference(tmp_path):
    t = next(t for t in load_library() if t.name == "fused-decode-attention")
    candidate = build_candidate(tmp_path / "candidate", [t])
    assert "cases 10" in run_interpreted(CHECK, candidate, tmp_path)
