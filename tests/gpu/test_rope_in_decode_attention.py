"""GPU checks of the `rope-in-decode-attention` library entry: the compiled decode kernel given a step's raw q, k, v
(q/k norm, RoPE and the KV write done inside) against the two kernels it replaces at Qwen3-0.6B shapes, on the
tensor cores and the CUDA cores; and fp32 engines with it keep E0's greedy tokens (CUDA graphs on).

Run on a CUDA machine: python -m pytest tests/gpu/test_rope_in_decode_attention.py -q
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate, load_module

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

NAME = "rope-in-decode-attention"


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate(NAME, tmp_path_factory.mktemp("candidate") / "engine_dir")


class _Layers:  # one cache layer, as qk_norm_rope_store indexes it
    def __init__(self, k, v):
        self.k, self.v = [k], [v]


@pytest.mark.parametrize("dtype, mma", [(torch.bfloat16, True), (torch.float32, False)])
@pytest.mark.parametrize("bs, lens, splits, block_n", [(1, [100], 32, 16), (1, [700], 32, 16),
                                                       (32, list(range(90, 410, 10)), 2, 32)])
def test_kernel_matches_norm_rope_store_then_decode(candidate, dtype, mma, bs, lens, splits, block_n):
    attention = load_module(candidate, "engine/kernels/triton_attention.py", "rope_in_decode_attention_kernel")
    ops = load_module(candidate, "engine/kernels/triton_ops.py", "rope_in_decode_attention_ops")
    hq, hk, d, page, eps = 16, 8, 128, 16, 1e-6
    g = torch.Generator(device="cuda").manual_seed(bs)
    slots = 2048 * page
    k_cache = torch.randn(slots, hk, d, device="cuda", generator=g).to(dtype)
    v_cache = torch.randn(slots, hk, d, device="cuda", generator=g).to(dtype)
    qkv = torch.randn(bs, (hq + 2 * hk) * d, device="cuda", generator=g).to(dtype)
    q, k, v = qkv[:, : hq * d].view(bs, hq, d), qkv[:, hq * d: (hq + hk) * d].view(bs, hk, d), qkv[:, (hq + hk) * d:].view(bs, hk, d)
    qw, kw = ((torch.rand(d, device="cuda", generator=g) + 0.5).to(dtype) for _ in range(2))
    width = max(lens) // page + 1
    page_table = (torch.randperm(slots // page - 1, device="cuda", generator=g)[: bs * width].view(bs, width) + 1).int()
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    pos = seq_lens.long() - 1
    out_slots = page_table.long()[torch.arange(bs, device="cuda"), pos // page] * page + pos % page
    t = torch.arange(4096, device="cuda", dtype=torch.float32)[:, None] / 1e6 ** (torch.arange(0, d, 2, device="cuda") / d)
    cos_sin = torch.cat((t.cos(), t.sin()), dim=-1)

    def scratch():
        return (torch.empty(bs, hq, splits, d, device="cuda"), torch.empty(bs, hq, splits, device="cuda"),
                torch.zeros(bs * hk, dtype=torch.int32, device="cuda"))

    want_k, want_v, want = k_cache.clone(), v_cache.clone(), torch.empty_like(q)
    q_rot = ops.qk_norm_rope_store(q, k, v, qw, kw, eps, pos, cos_sin, _Layers(want_k, want_v), 0, out_slots)
    attention.paged_decode(q_rot, want_k, want_v, page_table, seq_lens, want, *scratch(), page, block_n=block_n,
                           num_warps=4 if mma else 2, mma=mma)
    got, (mid_out, mid_lse, counters) = torch.empty_like(q), scratch()
    new = SimpleNamespace(k=k, v=v, q_norm=qw, k_norm=kw, eps=eps, positions=pos, cos_sin=cos_sin, slots=out_slots)
    attention.paged_decode(q, k_cache, v_cache, page_table, seq_lens, got, mid_out, mid_lse, counters, page,
                           block_n=block_n, num_warps=4 if mma else 2, mma=mma, new=new)
    torch.cuda.synchronize()
    # Compiled, the norm's reduction and RoPE's multiply-adds may round differently from the separate kernel's.
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1.6e-2, rtol=8e-3)
    torch.testing.assert_close(k_cache, want_k, **tol)
    assert torch.equal(v_cache, want_v)
    torch.testing.assert_close(got, want, **tol)
    assert int(counters.abs().sum()) == 0


def test_fp32_engine_keeps_e0_greedy_tokens_with_graphs(candidate):
    from seis.engine_host.client import Sampling

    def run(eng):
        return [g["token_ids"] for g in eng.generate(PROMPTS, Sampling(max_new_tokens=40, ignore_eos=True))]
    e0, got = e0_and_candidate(candidate, run)
    assert got == e0
