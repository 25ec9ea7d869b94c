"""The `gate-up-silu-epilogue` library entry on CPU, run by Triton's interpreter: the gate-up GEMV that returns
silu(gate) * up gives exactly what triton-gemv's GEMV followed by SiLU-and-mul gives (the same rounding points, the
same float32 accumulation per output), with the same new residual, and the down projection after it equals
triton-gemv's SiLU-prologue GEMV. The entry is built on its prerequisite (its patch is against E0 with it applied).

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
from engine.kernels import torch_ops, triton_gemv, triton_ops  # the candidate's

fused_calls = []
fused = triton_gemv.norm_gemv_silu_mul
triton_gemv.norm_gemv_silu_mul = lambda *a, **k: fused_calls.append(1) or fused(*a, **k)

g = torch.Generator().manual_seed(0)
eps, cases = 1e-6, 0
# (hidden, intermediate): a tail chunk of K and an intermediate size that is not a multiple of the tile. Per shape,
# the combinations below, not the whole product: every launch costs the interpreter about half a second. Qwen3-0.6B's shapes, whose plain gate-up
# GEMV takes wider tiles, are checked on the GPU (tests/gpu/test_gate_up_silu_epilogue.py).
F32, BF16 = torch.float32, torch.bfloat16
# The fused path (up to GEMV_MAX_TOKENS = 2 rows) in both dtypes, with and without a residual; E0's above it.
COMBOS = [(F32, False, 1), (BF16, True, 2), (F32, True, 2), (F32, True, 8), (BF16, False, 9)]
expected_fused = 0
for hidden, inter in [(64, 96), (200, 37)]:
    for dtype, with_residual, tokens in COMBOS:
        x = torch.randn(tokens, hidden, generator=g).to(dtype)
        res = torch.randn(tokens, hidden, generator=g).to(dtype) if with_residual else None
        nw = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
        gate_up = (torch.randn(2 * inter, hidden, generator=g) * 0.2).to(dtype)
        down = (torch.randn(hidden, inter, generator=g) * 0.2).to(dtype)
        # E0's add-RMSNorm above GEMV_MAX_TOKENS works in place: each path gets its own copies
        fresh = lambda: (x.clone(), res.clone() if res is not None else None)
        # what the candidate's prerequisite does: gate | up out of the GEMV, SiLU-and-mul in the down GEMV
        y, want_res = triton_ops.norm_linear(*fresh(), nw, eps, gate_up)
        want_act = triton_ops.silu_and_mul(y) if tokens > triton_gemv.GEMV_MAX_TOKENS else torch_ops.silu_and_mul(y)
        want_out = triton_ops.silu_mul_linear(y, down)
        act, got_res = triton_ops.norm_linear_silu_mul(*fresh(), nw, eps, gate_up)
        out = triton_ops.linear(act, down)
        # exact: the down projection's input is the value its SiLU prologue computed before
        for name, a, b in (("residual", got_res, want_res), ("down output", out, want_out)):
            assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), \
                (hidden, inter, dtype, with_residual, tokens, name, (a.float() - b.float()).abs().max())
        # torch's silu and x * sigmoid(x) may round silu(gate) one ulp apart, and the product after it
        rtol = 1e-6 if dtype == torch.float32 else 2 ** -6
        assert torch.allclose(act.float(), want_act.float(), rtol=rtol, atol=1e-6), (dtype, tokens)
        cases += 1
        expected_fused += tokens <= triton_gemv.GEMV_MAX_TOKENS
assert len(fused_calls) == expected_fused  # every case of up to GEMV_MAX_TOKENS took the fused GEMV
print(f"cases {cases}")
'''


@pytest.mark.slow
def test_gate_up_gemv_returns_the_activation_of_gemv_then_silu_and_mul(tmp_path):
    library = {t.name: t for t in load_library()}
    t = library["gate-up-silu-epilogue"]
    assert t.prerequisites == ("triton-gemv",)
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    out = run_interpreted(CHECK, candidate, tmp_path, timeout_s=600)
    assert "cases 10" in out
