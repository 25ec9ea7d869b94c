"""The `batched-mlp-matmuls` library entry on CPU, run by Triton's interpreter: its matmul and the matmul's
SiLU-and-mul epilogue against F.linear and E0's silu_and_mul (float32: bf16 tensor-core products are checked on the
GPU, tests/gpu/test_batched_mlp_matmuls.py), under the engine's tiles and the sweep's, and which row counts
triton_ops sends to it. The entry is built on its prerequisites (its patch is against E0 with them applied).

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
import torch.nn.functional as F

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.kernels import torch_ops, triton_matmul, triton_ops  # the candidate's

torch.manual_seed(0)


def close(got, want, what):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


def w(n, k):
    return torch.randn(n, k) / k ** 0.5


# (M, K, N): N and K off every tile (16 / 32 columns, 256-wide K chunks), one K past a chunk, 3 to 32 rows
for m, k, n in [(3, 40, 37), (8, 300, 50), (17, 64, 16), (32, 520, 33)]:
    x, weight, gate_up = torch.randn(m, k), w(n, k), w(2 * n, k)
    close(triton_matmul.matmul(x, weight), F.linear(x, weight), f"matmul {m, k, n}")
    act = triton_matmul.matmul(x, gate_up, silu_gate_up=True)
    assert act.shape == (m, n)
    close(act, torch_ops.silu_and_mul(F.linear(x, gate_up)), f"silu gate-up {m, k, n}")
x = torch.randn(6, 2 * 48)[:, :48]  # rows with a stride past their length
wt = w(20, 48)
close(triton_matmul.matmul(x, wt), F.linear(x, wt), "strided rows")
for tile in ({"block_n": 64, "block_k": 32, "stages": 2}, {"block_n": 16, "block_k": 128, "pdl": False}):
    x, gate_up = torch.randn(9, 300), w(2 * 70, 300)  # tails in N and K under the sweep's tiles
    close(triton_matmul.matmul(x, gate_up, silu_gate_up=True, **tile), torch_ops.silu_and_mul(F.linear(x, gate_up)),
          f"tile {tile}")

# triton_ops' entry points give E0's values at every row count, whichever kernel takes them
eps, k, n = 1e-6, 64, 40
nw = torch.rand(k) + 0.5
for m in (3, 8, triton_matmul.LINEAR_MIN_ROWS, triton_matmul.MAX_ROWS, triton_matmul.MAX_ROWS + 1):
    x, r, gate_up, weight = torch.randn(m, k), torch.randn(m, k), w(2 * n, k), w(n, k)
    h, want_res = torch_ops.add_rmsnorm(x.clone(), r.clone(), nw, eps)
    act, res = triton_ops.norm_linear_silu_mul(x.clone(), r.clone(), nw, eps, gate_up)
    close(act, torch_ops.silu_and_mul(F.linear(h, gate_up)), f"norm_linear_silu_mul m={m}")
    assert torch.equal(res, want_res), f"residual m={m}"
    act, res = triton_ops.norm_linear_silu_mul(x, None, nw, eps, gate_up)
    close(act, torch_ops.silu_and_mul(F.linear(torch_ops.rmsnorm(x, nw, eps), gate_up)), f"first layer m={m}")
    assert res is x
    close(triton_ops.linear(x, weight), F.linear(x, weight), f"linear m={m}")

# which kernel takes them: the matmul from 3 rows (gate-up) or LINEAR_MIN_ROWS (O, down) up to MAX_ROWS, not beyond
calls = []
matmul = triton_matmul.matmul
triton_matmul.matmul = lambda *a, **kw: calls.append((a[0].shape[0], kw.get("silu_gate_up", False))) or matmul(*a, **kw)
for m in (2, 3, 16, 17, 32, 33):
    triton_ops.norm_linear_silu_mul(torch.randn(m, k), torch.randn(m, k), nw, eps, w(2 * n, k))
    triton_ops.linear(torch.randn(m, k), w(n, k))
assert calls == [(3, True), (16, True), (17, True), (17, False), (32, True), (32, False)], calls
print("batched matmuls ok")
'''


@pytest.mark.slow
def test_batched_matmuls_give_e0s_values_and_take_the_rows_they_should(tmp_path):
    entry = next(t for t in load_library() if t.name == "batched-mlp-matmuls")
    assert entry.prerequisites == ("gate-up-silu-epilogue",)
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(entry))
    assert "batched matmuls ok" in run_interpreted(CHECK, candidate, tmp_path, timeout_s=600)
