"""GPU checks of the `gate-up-silu-epilogue` library entry: compiled, the gate-up GEMV that returns silu(gate) * up
and the plain down GEMV after it give exactly what triton-gemv's gate-up GEMV and SiLU-prologue down GEMV give at
Qwen3-0.6B shapes, also replayed from a CUDA graph, and an fp32 engine with it keeps E0's greedy tokens with graphs.

Run on a CUDA machine: python -m pytest tests/gpu/test_gate_up_silu_epilogue.py -q
"""
from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate, load_module  # noqa: E402


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate("gate-up-silu-epilogue", tmp_path_factory.mktemp("candidate") / "engine_dir")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_epilogue_matches_gemv_then_silu_prologue_at_qwen3_shapes(candidate, dtype):
    gemv = load_module(candidate, "engine/kernels/triton_gemv.py", "silu_epilogue_triton_gemv")
    hidden, inter, eps = 1024, 3072, 1e-6
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)

    gate_up, down, nw = rnd(2 * inter, hidden, scale=0.05), rnd(hidden, inter, scale=0.05), rnd(hidden) + 1
    for tokens in (1, 3, 8):
        x, res = rnd(tokens, hidden), rnd(tokens, hidden)
        y, want_res = gemv.norm_gemv(x, res, nw, eps, gate_up)
        want = gemv.silu_mul_gemv(y, down)
        gemv.norm_gemv_silu_mul(x, res, nw, eps, gate_up)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            act, got_res = gemv.norm_gemv_silu_mul(x, res, nw, eps, gate_up)
            got = gemv.gemv(act, down)
        for _ in range(2):
            got.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            what = f"{tokens} tokens {dtype}"
            assert act.shape == (tokens, inter), what
            torch.testing.assert_close(got_res, want_res, atol=0, rtol=0, msg=what)
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=what)


def test_fp32_engine_keeps_e0_tokens_with_graphs(candidate):
    from seis.engine_host.client import Sampling

    def run(eng):
        out = [g["token_ids"] for g in eng.generate(PROMPTS, Sampling(max_new_tokens=24, ignore_eos=True))]
        stats = eng.stats()
        assert stats["kernel_backend"] == "triton" and stats["graph_replays"] > 0
        return out

    e0, cand = e0_and_candidate(candidate, run)
    assert cand == e0
