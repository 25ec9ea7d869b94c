"""The batched-mlp-matmuls library entry on CPU, through Triton's interpreter: its matmul and the matmul's
SiLU-and-mul epilogue against F.linear and E0's silu_and_mul (float32), and which rows triton_ops sends to it.

The candidate engine is imported in a child process that sets TRITON_INTERPRET=1 before Triton is imported, so
its `engine` package never meets E0's. This file is also that child's script.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # one child process runs every case under Triton's interpreter
CASES = ["matmul", "silu_gate_up", "dispatch"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    pytest.importorskip("triton")
    from seis.agents.offline.library import load_library
    from seis.agents.offline.merge import with_prerequisites
    from seis.agents.offline.verify import build_candidate

    entry = next(t for t in load_library() if t.name == "batched-mlp-matmuls")
    engine_dir = build_candidate(tmp_path_factory.mktemp("cand") / "engine", with_prerequisites(entry))
    out = engine_dir.parent / "results.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, __file__, str(engine_dir), str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", CASES)
def test_batched_matmul_matches_e0s_ops(results, case):
    assert case in results, f"the child ran no case {case}"
    assert results[case] == "", results[case]


# ---- the child: runs with TRITON_INTERPRET=1 and the candidate engine on sys.path --------------------------------

def _child(engine_dir: str, out: str) -> None:
    import traceback

    import torch
    import torch.nn.functional as F

    from seis.engine_import import import_engine

    torch.manual_seed(0)
    import_engine(engine_dir)
    from engine.kernels import torch_ops, triton_matmul, triton_ops

    def close(got, want, what):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")

    def w(n, k):
        return torch.randn(n, k) / k ** 0.5

    # (M, K, N): N and K off every tile (16 / 32 columns, 256-wide K chunks), one K past a chunk, 3 to 32 rows.
    shapes = [(3, 40, 37), (8, 300, 50), (17, 64, 16), (32, 520, 33)]

    def case_matmul():
        for m, k, n in shapes:
            x, weight = torch.randn(m, k), w(n, k)
            close(triton_matmul.matmul(x, weight), F.linear(x, weight), f"matmul {m, k, n}")
        x = torch.randn(6, 2 * 48)[:, :48]  # rows with a stride past their length
        weight = w(20, 48)
        close(triton_matmul.matmul(x, weight), F.linear(x, weight), "strided rows")
        for tile in ({"block_n": 64, "block_k": 32, "stages": 2}, {"block_n": 16, "block_k": 128, "pdl": False}):
            x, gate_up = torch.randn(9, 300), w(2 * 70, 300)  # tails in N and K under the sweep's tiles
            close(triton_matmul.matmul(x, gate_up, silu_gate_up=True, **tile),
                  torch_ops.silu_and_mul(F.linear(x, gate_up)), f"tile {tile}")

    def case_silu_gate_up():
        for m, k, n in shapes:
            x, gate_up = torch.randn(m, k), w(2 * n, k)
            got = triton_matmul.matmul(x, gate_up, silu_gate_up=True)
            assert got.shape == (m, n)
            close(got, torch_ops.silu_and_mul(F.linear(x, gate_up)), f"silu gate-up {m, k, n}")

    def case_dispatch():
        # triton_ops' entry points give E0's values at every row count, whichever kernel takes them; which kernel
        # that is: the batched matmul from 3 (gate-up) or LINEAR_MIN_ROWS (O, down) to MAX_ROWS rows, not beyond.
        eps, k, n = 1e-6, 64, 40
        nw = torch.rand(k) + 0.5
        for m in (3, 8, triton_matmul.LINEAR_MIN_ROWS, triton_matmul.MAX_ROWS, triton_matmul.MAX_ROWS + 1):
            x, r, gate_up, weight = torch.randn(m, k), torch.randn(m, k), w(2 * n, k), w(n, k)
            h, want_res = torch_ops.add_rmsnorm(x.clone(), r.clone(), nw, eps)
            act, res = triton_ops.norm_linear_silu_mul(x.clone(), r.clone(), nw, eps, gate_up)
            close(act, torch_ops.silu_and_mul(F.linear(h, gate_up)), f"norm_linear_silu_mul m={m}")
            assert torch.equal(res, want_res), f"residual m={m}"
            act, res = triton_ops.norm_linear_silu_mul(x, None, nw, eps, gate_up)
            close(act, torch_ops.silu_and_mul(F.linear(torch_ops.rmsnorm(x, nw, eps), gate_up)), f"first m={m}")
            assert res is x
            close(triton_ops.linear(x, weight), F.linear(x, weight), f"linear m={m}")
        calls = []
        original = triton_matmul.matmul
        triton_matmul.matmul = lambda *a, **kw: calls.append((a[0].shape[0], kw.get("silu_gate_up", False))) \
            or original(*a, **kw)
        try:
            for m in (2, 3, 16, 17, 32, 33):
                triton_ops.norm_linear_silu_mul(torch.randn(m, k), torch.randn(m, k), nw, eps, w(2 * n, k))
                triton_ops.linear(torch.randn(m, k), w(n, k))
        finally:
            triton_matmul.matmul = original
        assert calls == [(3, True), (16, True), (17, True), (17, False), (32, True), (32, False)], calls

    results = {}
    for name in CASES:
        try:
            locals()[f"case_{name}"]()
            results[name] = ""
        except Exception:  # noqa: BLE001 -- reported to the parent, which fails the case
            results[name] = traceback.format_exc()[-3000:]
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
