"""GPU checks of the `batched-gemv` library entry: compiled, its tensor-core projections at Qwen3-0.6B shapes against
E0's unfused ops + F.linear for 2 to 64 rows (also replayed from a CUDA graph), and an fp32 engine with it keeps
E0's greedy tokens with graphs at batch 4.

Run on a CUDA machine: python -m pytest tests/gpu/test_batched_gemv.py -q
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate  # noqa: E402

HIDDEN, QKV, Q, INTER, VOCAB, EPS = 1024, 4096, 2048, 3072, 151936, 1e-6


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate("batched-gemv", tmp_path_factory.mktemp("candidate") / "engine_dir")


@pytest.fixture(scope="module")
def kernels(candidate):
    """The candidate's kernels package under another name, beside E0's `engine`."""
    path = candidate / "engine" / "kernels"
    spec = importlib.util.spec_from_file_location("batched_gemv_kernels", path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    return (importlib.import_module("batched_gemv_kernels.triton_batched_gemv"),
            importlib.import_module("batched_gemv_kernels.torch_ops"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_projections_match_unfused_at_qwen3_shapes(kernels, dtype):
    bg, ops = kernels
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)

    # float32: exact products, accumulation order only; bf16: one rounding of a float32 sum on each side
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2e-3)
    qkv, o, gate_up, down = (rnd(QKV, HIDDEN, scale=0.03), rnd(HIDDEN, Q, scale=0.03),
                             rnd(2 * INTER, HIDDEN, scale=0.03), rnd(HIDDEN, INTER, scale=0.03))
    lm_head, nw = rnd(VOCAB, HIDDEN, scale=0.03), rnd(HIDDEN) + 1
    for m in (2, 8, 32, 64):
        x, res, a = rnd(m, HIDDEN), rnd(m, HIDDEN), rnd(m, Q)
        h, want_res = ops.add_rmsnorm(x.clone(), res.clone(), nw, EPS)
        gu = F.linear(h, gate_up)
        rows = torch.arange(m - 1, -1, -2, device="cuda")
        want = {"qkv": F.linear(h, qkv), "o": F.linear(a, o), "act": ops.silu_and_mul(gu),
                "down": F.linear(ops.silu_and_mul(gu), down), "lm_head": F.linear(h.index_select(0, rows), lm_head)}

        def run():
            y, new_res = bg.norm_gemv(x, res, nw, EPS, qkv)
            act, _ = bg.norm_gemv_silu_mul(x, res, nw, EPS, gate_up)
            return {"qkv": y, "o": bg.gemv(a, o), "act": act, "down": bg.silu_mul_gemv(gu, down),
                    "lm_head": bg.norm_gemv(x, res, nw, EPS, lm_head, rows=rows)[0], "residual": new_res}

        eager = run()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run()
        graph.replay()
        torch.cuda.synchronize()
        for name, value in want.items():
            torch.testing.assert_close(eager[name].float(), value.float(), **tol, msg=f"{name} m={m} {dtype}")
            assert torch.equal(captured[name], eager[name]), f"{name} m={m}: the graph replay differs"
        assert torch.equal(eager["residual"], want_res) and torch.equal(captured["residual"], want_res)


def test_fp32_engine_keeps_e0_tokens_with_graphs(candidate):
    from seis.engine_host.client import Sampling

    def run(eng):
        out = [g["token_ids"] for g in eng.generate(PROMPTS, Sampling(max_new_tokens=24, ignore_eos=True))]
        stats = eng.stats()
        assert stats["kernel_backend"] == "triton" and stats["graph_replays"] > 0
        return out

    e0, cand = e0_and_candidate(candidate, run)
    assert cand == e0
