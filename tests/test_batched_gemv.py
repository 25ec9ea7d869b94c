"""The `batched-gemv` library entry on CPU, run by Triton's interpreter (bf16 as the GPU computes it): its tensor-core
projections against E0's unfused ops + F.linear for 2 to 64 rows, triton_ops' dispatch (one row to triton-gemv's
GEMV, 2 to 64 to this kernel, more to E0's kernels), and tiny-qwen3 decoding a batch through it against E0's
torch path. Qwen3-0.6B's shapes are checked on the GPU (tests/gpu/test_batched_gemv.py).
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
import torch.nn.functional as F

from interpreter_bf16 import gpu_like_bf16
from seis.engine_import import import_engine

gpu_like_bf16()
import_engine(sys.argv[1])
from engine.kernels import torch_ops, triton_batched_gemv as bg, triton_gemv, triton_ops  # the candidate's

g = torch.Generator().manual_seed(0)
eps, F32, BF16 = 1e-6, torch.float32, torch.bfloat16


def rnd(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def close(got, want, what):
    # float32: exact products (IEEE dot), accumulation order only; bf16: one rounding of a float32 sum each side
    tol = dict(rtol=1e-5, atol=1e-5) if got.dtype == F32 else dict(rtol=2 ** -7, atol=2e-3)
    torch.testing.assert_close(got.float(), want.float(), **tol, msg=lambda m: f"{what}: {m}")


# (dtype, rows, K, N): tails in K and N, one row short of a 16-row tile, 17 and 33 (a wider tile), 64 (the most)
for dtype, m, k, n in [(F32, 2, 40, 37), (BF16, 5, 100, 45), (F32, 17, 64, 20), (BF16, 33, 48, 70),
                       (BF16, 64, 32, 16)]:
    what = f"{dtype} m={m} k={k} n={n}"
    x, r, nw = rnd(m, k, dtype=dtype), rnd(m, k, dtype=dtype), rnd(k, dtype=dtype) + 1.5
    w, b = rnd(n, k, dtype=dtype, scale=k ** -0.5), rnd(n, dtype=dtype)
    h, want_res = torch_ops.add_rmsnorm(x.clone(), r.clone(), nw, eps)
    x0, r0 = x.clone(), r.clone()
    y, res = bg.norm_gemv(x, r, nw, eps, w, b)
    close(y, F.linear(h, w, b), f"add-rmsnorm {what}")
    assert torch.equal(res, want_res), f"residual {what}"
    assert torch.equal(x, x0) and torch.equal(r, r0), f"inputs changed {what}"
    y, res = bg.norm_gemv(x, None, nw, eps, w)
    close(y, F.linear(torch_ops.rmsnorm(x, nw, eps), w), f"rmsnorm {what}")
    assert res is x
    close(bg.gemv(x, w), F.linear(x, w), f"plain {what}")
    gu = rnd(m, 2 * k, dtype=dtype)
    close(bg.silu_mul_gemv(gu, w), F.linear(torch_ops.silu_and_mul(gu), w), f"silu-mul prologue {what}")
    gate_up = rnd(2 * n, k, dtype=dtype, scale=k ** -0.5)
    act, res = bg.norm_gemv_silu_mul(x, r, nw, eps, gate_up)
    close(act, torch_ops.silu_and_mul(F.linear(h, gate_up)), f"silu-mul epilogue {what}")
    assert torch.equal(res, want_res), f"epilogue residual {what}"
    rows = torch.tensor([m - 1, 0] + list(range(1, m - 1, 3)))
    close(bg.norm_gemv(x, r, nw, eps, w, rows=rows)[0], F.linear(h.index_select(0, rows), w),
          f"gathered rows {what}")
    print("case", what, flush=True)

# triton_ops' dispatch: which kernel each row count reaches
calls = []
for module in (triton_gemv, bg):
    for fn in ("norm_gemv", "gemv"):
        real = getattr(module, fn)
        setattr(module, fn, lambda *a, _r=real, _m=module.__name__, **kw: calls.append(_m) or _r(*a, **kw))
for m, expect in ((1, "triton_gemv"), (2, "triton_batched_gemv"), (bg.BATCHED_MAX_TOKENS, "triton_batched_gemv"),
                  (bg.BATCHED_MAX_TOKENS + 1, None)):
    calls.clear()
    x, r, nw, w = rnd(m, 16, dtype=F32), rnd(m, 16, dtype=F32), rnd(16, dtype=F32) + 1.5, rnd(24, 16, dtype=F32)
    h, want_res = torch_ops.add_rmsnorm(x.clone(), r.clone(), nw, eps)
    y, res = triton_ops.norm_linear(x.clone(), r.clone(), nw, eps, w)
    close(y, F.linear(h, w), f"norm_linear m={m}")
    close(triton_ops.linear(x, w), F.linear(x, w), f"linear m={m}")
    assert [c.rsplit(".", 1)[-1] for c in calls] == ([expect] * 2 if expect else []), (m, calls)
    print("dispatch", m, flush=True)

# tiny-qwen3 (fp32): two requests decode at batch 2 through the candidate's triton ops, against E0's torch ops
import engine as E
from engine.kernels import Ops
from seis.models import resolve_model

eng = E.Engine(resolve_model("tiny-qwen3"), {"device": "cpu", "max_batch_size": 2, "max_seq_len": 32,
                                             "page_size": 4}).build()
prompts = [[5, 17, 33, 100], [9] * 11]
run = lambda: [o.token_ids for o in eng.generate(prompts, E.SamplingParams(max_new_tokens=2, ignore_eos=True))]
want = run()
ops = Ops("triton", triton_ops)
eng.model.ops = ops
for layer in eng.model.layers:
    layer.ops = ops
calls.clear()
assert run() == want
assert "engine.kernels.triton_batched_gemv" in calls, calls
print("model ok")
'''


@pytest.mark.slow
def test_batched_projections_match_e0_and_dispatch_by_rows(tmp_path):
    t = {t.name: t for t in load_library()}["batched-gemv"]
    assert t.prerequisites == ("gate-up-silu-epilogue", "triton-gemv")
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    out = run_interpreted(CHECK, candidate, tmp_path, timeout_s=600)
    assert out.count("case ") == 5 and out.count("dispatch ") == 4 and "model ok" in out, out
