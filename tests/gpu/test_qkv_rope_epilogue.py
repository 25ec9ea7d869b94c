"""GPU checks of the `qkv-rope-epilogue` library entry: compiled, the QKV GEMV with the q/k norm, RoPE and KV
write in its epilogue gives what triton-gemv's GEMV followed by fused-qk-rope-store's kernel gives at Qwen3-0.6B
shapes, also replayed from a CUDA graph (its counters reset themselves), and an fp32 engine with it keeps E0's
greedy tokens with graphs on.

Run on a CUDA machine: python -m pytest tests/gpu/test_qkv_rope_epilogue.py -q
"""
from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate, load_module  # noqa: E402


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate("qkv-rope-epilogue", tmp_path_factory.mktemp("candidate") / "engine_dir")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_epilogue_matches_gemv_then_rope_store_at_qwen3_shapes(candidate, dtype):
    gemv = load_module(candidate, "engine/kernels/triton_gemv.py", "epilogue_triton_gemv")
    hq, hk, d, hidden, eps, pages, page = 16, 8, 128, 1024, 1e-6, 512, 16
    n = (hq + 2 * hk) * d
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)

    w, nw = rnd(n, hidden, scale=0.05), rnd(hidden) + 1
    wq, wk = rnd(d) + 1, rnd(d) + 1
    cs = torch.randn(4096, d, device="cuda", generator=g)  # any float32 table: both paths read the same rows
    for tokens in (1, 3, 8):
        x, res = rnd(tokens, hidden), rnd(tokens, hidden)
        pos = torch.randperm(4096, device="cuda", generator=g)[:tokens]
        slots = torch.randperm(pages * page, device="cuda", generator=g)[:tokens]
        # the reference: the unfused pair, with fused-qk-rope-store's arithmetic written out in torch
        qkv, want_res = gemv.norm_gemv(x, res, nw, eps, w)
        q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=1)
        q, k, v = q.view(tokens, hq, d), k.view(tokens, hk, d), v.view(tokens, hk, d)
        want_q, want_k = _norm_rope(q, wq, eps, cs[pos]), _norm_rope(k, wk, eps, cs[pos])
        k_cache, v_cache = rnd(pages * page, hk, d), rnd(pages * page, hk, d)
        want_kc, want_vc = k_cache.clone(), v_cache.clone()
        want_kc[slots], want_vc[slots] = want_k, v
        q_out = torch.empty(tokens, hq, d, dtype=dtype, device="cuda")
        rope = gemv.RopeStore(hq, hk, d, wq, wk, eps, pos, cs, k_cache, v_cache, slots, q_out)
        gemv.norm_gemv_rope_store(x, res, nw, eps, w, None, rope)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got_q, got_res = gemv.norm_gemv_rope_store(x, res, nw, eps, w, None, rope)
        for _ in range(2):  # each replay relies on the one before having reset the counters
            q_out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            what = f"{tokens} tokens {dtype}"
            tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=1.6e-2)
            torch.testing.assert_close(got_res, want_res, atol=0, rtol=0, msg=what)
            torch.testing.assert_close(got_q, want_q, **tol, msg=what)
            torch.testing.assert_close(k_cache, want_kc, **tol, msg=what)
            assert torch.equal(v_cache, want_vc), what


def _norm_rope(x, weight, eps, cs):
    """fused-qk-rope-store's rounding points: x * rstd rounded, times the weight rounded, RoPE in float32."""
    dt, half = x.dtype, x.shape[-1] // 2
    xf = x.float()
    normed = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dt).float() * weight.float()).to(dt)
    x1, x2 = normed[..., :half].float(), normed[..., half:].float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dt)


def test_fp32_engine_keeps_e0_tokens_with_graphs(candidate):
    from seis.engine_host.client import Sampling

    def run(eng):
        out = [g["token_ids"] for g in eng.generate(PROMPTS, Sampling(max_new_tokens=24, ignore_eos=True))]
        stats = eng.stats()
        assert stats["kernel_backend"] == "triton" and stats["graph_replays"] > 0
        return out

    e0, cand = e0_and_candidate(candidate, run)
    assert cand == e0
