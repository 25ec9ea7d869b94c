"""GPU checks of the `batched-mlp-matmuls` library entry: compiled, its matmul and the SiLU-and-mul epilogue agree
with cuBLAS's F.linear and E0's silu_and_mul at Qwen3-0.6B shapes and 3 to 32 rows (bf16 within an ulp of the
output, float32 exactly as the ieee path allows), also replayed from a CUDA graph; and an fp32 engine with it keeps
E0's greedy tokens with graphs, at 4 and at 20 requests (the second through the O and down matmuls too).

Run on a CUDA machine: python -m pytest tests/gpu/test_batched_mlp_matmuls.py -q
"""
from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gpu_candidates import OPTIONS, PROMPTS, e0_and_candidate, library_candidate, load_module  # noqa: E402


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate("batched-mlp-matmuls", tmp_path_factory.mktemp("candidate") / "engine_dir")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matmuls_match_cublas_and_silu_and_mul_at_qwen3_shapes(candidate, dtype):
    mm = load_module(candidate, "engine/kernels/triton_matmul.py", "batched_triton_matmul")
    hidden, inter = 1024, 3072
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)

    gate_up, down, o = rnd(2 * inter, hidden, scale=0.05), rnd(hidden, inter, scale=0.05), rnd(hidden, 2048, scale=0.05)
    # bf16: about one ulp of the output; float32: the accumulation order over K (values up to about 10 here)
    tol = dict(rtol=2 ** -7, atol=2e-3) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
    for rows in (3, 8, 17, 32):
        x, attn = rnd(rows, hidden), rnd(rows, 2048)
        want_act = torch.nn.functional.silu(x.float() @ gate_up[:inter].float().T).to(dtype).float() \
            * (x.float() @ gate_up[inter:].float().T).to(dtype).float()
        mm.matmul(mm.matmul(x, gate_up, silu_gate_up=True), down), mm.matmul(attn, o)  # compiled before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            act = mm.matmul(x, gate_up, silu_gate_up=True)
            got_down = mm.matmul(act, down)
            got_o = mm.matmul(attn, o)
        for _ in range(2):
            act.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            what = f"{rows} rows {dtype}"
            # gate and up, each rounded, may each be an ulp off cuBLAS's: their rounded product up to two
            act_tol = dict(tol, rtol=2 ** -6) if dtype == torch.bfloat16 else tol
            torch.testing.assert_close(act.float(), want_act, **act_tol, msg=lambda m: f"{what} gate-up: {m}")
            torch.testing.assert_close(got_down.float(), torch.nn.functional.linear(act, down).float(), **tol,
                                       msg=lambda m: f"{what} down: {m}")
            torch.testing.assert_close(got_o.float(), torch.nn.functional.linear(attn, o).float(), **tol,
                                       msg=lambda m: f"{what} O: {m}")


def test_fp32_engine_keeps_e0_tokens_with_graphs(candidate):
    from seis.engine_host.client import Sampling

    def run(eng):
        greedy = Sampling(max_new_tokens=24, ignore_eos=True)
        out = [g["token_ids"] for g in eng.generate(prompts, greedy)]
        stats = eng.stats()
        assert stats["kernel_backend"] == "triton" and stats["graph_replays"] > 0
        return out

    prompts = PROMPTS  # decode at 4 rows: the gate-up matmul
    e0, cand = e0_and_candidate(candidate, run)
    assert cand == e0
    prompts = [[7 + i, 11 * i % 97, 3 + i] + PROMPTS[i % 4] for i in range(20)]  # 20 rows: O and down too
    e0, cand = e0_and_candidate(candidate, run, {**OPTIONS, "max_batch_size": 20})
    assert cand == e0
