"""The triton-gemv library transformation's fused GEMV kernels against E0's unfused ops + F.linear, on CPU through
Triton's interpreter; and the model wired through them (tiny-qwen3) against E0's torch path.

The candidate engine (E0 + triton-gemv) is imported in a child process that sets TRITON_INTERPRET=1 before
Triton is imported, so its `engine` package never meets E0's. This file is also that child's script.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # one child process runs every case under Triton's interpreter (about a minute)
KERNELS = ["gemv", "norm_gemv_first_layer", "norm_gemv_add", "norm_gemv_bias", "silu_mul_gemv", "lm_head_rows",
           "tile_overrides", "dispatch_above_threshold"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    pytest.importorskip("triton")
    from seis.agents.offline.library import load_library
    from seis.agents.offline.verify import build_candidate

    library = {t.name: t for t in load_library()}
    engine_dir = build_candidate(tmp_path_factory.mktemp("cand") / "engine", [library["triton-gemv"]])
    out = engine_dir.parent / "results.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, __file__, str(engine_dir), str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", KERNELS)
def test_fused_kernel_matches_unfused_reference(results, case):
    assert case in results, f"the child ran no case {case}"
    assert results[case] == "", results[case]


def test_model_through_the_kernels_matches_the_torch_path(results):
    assert results["model"] == "", results["model"]


# ---- the child: runs with TRITON_INTERPRET=1 and the candidate engine on sys.path --------------------------------

def _round_bf16_to_nearest_even() -> None:
    """Triton's interpreter narrows float32 to bf16 by truncation (and its RTNE mode mishandles the mantissa carry);
    the GPU rounds to nearest even (cvt.rn.bf16.f32), as torch does. Give the interpreter torch's conversion, so
    the rounding points the kernels share with E0 are compared as the GPU runs them."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float

    def _convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            f32 = torch.from_numpy(np.ascontiguousarray(data).view(np.float32))
            return f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return convert(data, src, dst, rounding_mode)

    interpreter._convert_float = _convert


def _child(engine_dir: str, out: str) -> None:
    import traceback

    import torch
    import torch.nn.functional as F

    from seis.engine_import import import_engine

    _round_bf16_to_nearest_even()
    torch.manual_seed(0)
    import_engine(engine_dir)
    from engine.kernels import torch_ops, triton_gemv, triton_ops

    eps = 1e-6
    dtypes = (torch.float32, torch.bfloat16)

    def each(items):
        """Both dtypes over the items, one per item: every launch costs the interpreter dearly."""
        return [(dtypes[i % 2], item) for i, item in enumerate(items)]

    def close(got, want, dtype, what):
        # float32: accumulation order only. bf16: both sides round a float32 sum once, so at most about one
        # bf16 ulp apart (rtol 2**-7), plus a rare ulp flip of a normalized input when rstd's last bit differs.
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2e-3)
        torch.testing.assert_close(got.float(), want.float(), **tol, msg=lambda m: f"{what}: {m}")

    def data(m, k, n, dtype, rows=None):
        x = torch.randn(rows or m, k).to(dtype)
        r = torch.randn(rows or m, k).to(dtype)
        nw = (torch.rand(k) + 0.5).to(dtype)
        w = (torch.randn(n, k) / k ** 0.5).to(dtype)
        return x, r, nw, w

    # (M, K, N): non-multiples of every block size, a few Qwen3-like small shapes, and one realistic K.
    small = [(1, 40, 37), (3, 100, 5), (8, 64, 96), (3, 40, 37)]
    realistic = [(3, 1024, 24)]

    def case_gemv():
        for dtype, (m, k, n) in each(small + [(1, 2048, 12)]):
            x, _, _, w = data(m, k, n, dtype)
            close(triton_gemv.gemv(x, w), F.linear(x, w), dtype, f"gemv {dtype} {m, k, n}")

    def case_norm_first():
        for dtype, (m, k, n) in each(small + realistic):
            x, _, nw, w = data(m, k, n, dtype)
            y, res = triton_gemv.norm_gemv(x, None, nw, eps, w)
            close(y, F.linear(torch_ops.rmsnorm(x, nw, eps), w), dtype, f"rmsnorm gemv {dtype} {m, k, n}")
            assert res is x

    def case_norm_add():
        for dtype, (m, k, n) in each(realistic + small):
            x, r, nw, w = data(m, k, n, dtype)
            x0, r0 = x.clone(), r.clone()
            h, ref_res = torch_ops.add_rmsnorm(x, r, nw, eps)
            y, res = triton_gemv.norm_gemv(x, r, nw, eps, w)
            close(y, F.linear(h, w), dtype, f"add-rmsnorm gemv {dtype} {m, k, n}")
            assert torch.equal(res, ref_res), f"residual {dtype} {m, k, n}"
            assert torch.equal(x, x0) and torch.equal(r, r0), "inputs must stay untouched (out of place)"

    def case_norm_bias():
        for dtype, (m, k, n) in each(small[:2]):
            x, r, nw, w = data(m, k, n, dtype)
            b = torch.randn(n).to(dtype)
            h, _ = torch_ops.add_rmsnorm(x, r, nw, eps)
            y, _ = triton_gemv.norm_gemv(x, r, nw, eps, w, b)
            close(y, F.linear(h, w, b), dtype, f"biased gemv {dtype} {m, k, n}")
            y, _ = triton_gemv.norm_gemv(x, None, nw, eps, w, b)
            close(y, F.linear(torch_ops.rmsnorm(x, nw, eps), w, b), dtype, f"biased first {dtype} {m, k, n}")

    def case_silu():
        for dtype, (m, k, n) in each(small + [(1, 3072, 8)]):
            gu = torch.randn(m, 2 * k).to(dtype)
            w = (torch.randn(n, k) / k ** 0.5).to(dtype)
            close(triton_gemv.silu_mul_gemv(gu, w), F.linear(torch_ops.silu_and_mul(gu), w), dtype,
                  f"silu-mul gemv {dtype} {m, k, n}")

    def case_lm_head():
        for dtype, rows in each(([10, 3, 0], [0], list(range(8)), [4, 4])):
            x, r, nw, w = data(None, 48, 77, dtype, rows=11)
            idx = torch.tensor(rows)
            ref = torch_ops.norm_linear_rows(x, r, idx, nw, eps, w)
            want = F.linear(torch_ops.add_rmsnorm(x, r, nw, eps)[0].index_select(0, idx), w)
            assert torch.equal(ref, want), "torch norm_linear_rows must be E0's sequence"
            x0, r0 = x.clone(), r.clone()
            close(triton_ops.norm_linear_rows(x, r, idx, nw, eps, w), want, dtype, f"lm_head {dtype} {rows}")
            assert torch.equal(x, x0) and torch.equal(r, r0), f"lm_head {rows} changed its inputs"

    def case_tiles():
        # Tails in N and K with several K chunks, under explicit tiles (as the benchmark's sweep sets them).
        for dtype, (block_n, block_k, warps) in each(((8, 32, 4), (16, 64, 2), (4, 128, 8), (8, 64, 4))):
            x, r, nw, w = data(3, 100, 45, dtype)
            h, _ = torch_ops.add_rmsnorm(x, r, nw, eps)
            tile = dict(block_n=block_n, block_k=block_k, num_warps=warps)
            y, res = triton_gemv.norm_gemv(x, r, nw, eps, w, **tile)
            close(y, F.linear(h, w), dtype, f"tiles {tile} {dtype}")
            assert torch.equal(res, x + r)
            close(triton_gemv.gemv(x, w, **tile), F.linear(x, w), dtype, f"plain tiles {tile}")
        assert triton_gemv.tiles(1, 151936, 1024)[1:3] == (4, 1024)  # the swept H200 tiles
        assert all(-(-n // triton_gemv.tiles(1, n, k)[1]) >= 256  # programs at Qwen3-0.6B's shapes
                   for n, k in ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)))
        # At one token a program's whole slice of W is one chunk, all of it loaded before the PDL wait.
        assert all(triton_gemv.tiles(1, n, k)[2] >= k
                   for n, k in ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (151936, 1024)))

    def case_dispatch():
        # triton_ops' entry points: <= GEMV_MAX_TOKENS rows fused, more rows E0's kernels + F.linear.
        for dtype, m in each((2, triton_gemv.GEMV_MAX_TOKENS + 1, 3, triton_gemv.GEMV_MAX_TOKENS + 2)):
            x, r, nw, w = data(m, 64, 40, dtype)
            h, ref_res = torch_ops.add_rmsnorm(x, r, nw, eps)
            y, res = triton_ops.norm_linear(x.clone(), r.clone(), nw, eps, w)
            close(y, F.linear(h, w), dtype, f"norm_linear m={m}")
            assert torch.equal(res, ref_res)
            gu = torch.randn(m, 80).to(dtype)
            close(triton_ops.silu_mul_linear(gu, w[:, :40]), F.linear(torch_ops.silu_and_mul(gu), w[:, :40]),
                  dtype, f"silu_mul_linear m={m}")
            close(triton_ops.linear(x, w), F.linear(x, w), dtype, f"linear m={m}")

    def case_model():
        # tiny-qwen3 (fp32): E0's torch ops vs the candidate's triton ops (every kernel interpreted) in one engine.
        # Both prompts prefill through E0's kernels (more than GEMV_MAX_TOKENS rows) and decode at batch 2 through
        # the GEMVs; the 4-token prompt's logits come from its gathered last row through the LM-head GEMV.
        import triton

        import engine as E
        from engine.kernels import Ops
        from seis.models import resolve_model

        eng = E.Engine(resolve_model("tiny-qwen3"), {"device": "cpu", "max_batch_size": 4, "max_seq_len": 64,
                                                     "page_size": 4}).build()
        prompts = [[5, 17, 33, 100], [9] * 9]

        def run():
            # one decode step at batch 2 after the prefill, and the 4-token prompt's prefill alone: each launch
            # costs the interpreter about half a second
            gens = [g.token_ids for g in eng.generate(prompts, E.SamplingParams(max_new_tokens=2, ignore_eos=True))]
            single = eng.generate([[200, 7, 1, 2]], E.SamplingParams(max_new_tokens=1, ignore_eos=True))[0]
            return gens, single.token_ids, eng.score(prompts[:1], gens[:1], top_k=3)

        ref = run()
        # one program per projection: the interpreter runs programs one by one (the tile cases cover the rest)
        triton_gemv.tiles = lambda m, n, k: (triton.next_power_of_2(m), triton.next_power_of_2(n),
                                             triton.next_power_of_2(k), 4)
        ops = Ops("triton", triton_ops)
        eng.model.ops = ops
        for layer in eng.model.layers:
            layer.ops = ops
        got = run()
        assert got[0] == ref[0] and got[1] == ref[1], f"greedy tokens differ: {got[:2]} vs {ref[:2]}"
        for a, b in zip(got[2], ref[2]):
            assert a.top_ids == b.top_ids
            torch.testing.assert_close(torch.tensor(a.token_logprobs), torch.tensor(b.token_logprobs),
                                       rtol=1e-4, atol=1e-4)

    cases = {"gemv": case_gemv, "norm_gemv_first_layer": case_norm_first, "norm_gemv_add": case_norm_add,
             "norm_gemv_bias": case_norm_bias, "silu_mul_gemv": case_silu, "lm_head_rows": case_lm_head,
             "tile_overrides": case_tiles, "dispatch_above_threshold": case_dispatch, "model": case_model}
    results = {}
    for name, fn in cases.items():
        try:
            fn()
            results[name] = ""
        except Exception:  # reported to the parent test of that name
            results[name] = traceback.format_exc(limit=3)
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
