"""GPU checks of the `qkv-rope-store-epilogue` library entry: compiled, the QKV GEMV whose last program per head
normalizes, rotates and stores gives what triton-gemv's GEMV followed by fused-qk-rope-store's kernel gives at
Qwen3-0.6B shapes, replayed from a CUDA graph many times (the counters must return to zero after every launch, and
the program that finishes a head must see every other program's part of it).

Run on a CUDA machine: python -m pytest tests/gpu/test_qkv_rope_store_epilogue.py -q
"""
from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gpu_candidates import library_candidate, load_module  # noqa: E402


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """(the entry's triton_gemv, fused-qk-rope-store's triton_ops on E0): both import only torch and triton."""
    root = tmp_path_factory.mktemp("candidates")
    entry = library_candidate("qkv-rope-store-epilogue", root / "entry")
    reference = library_candidate("fused-qk-rope-store", root / "reference")
    return (load_module(entry, "engine/kernels/triton_gemv.py", "epilogue_triton_gemv"),
            load_module(reference, "engine/kernels/triton_ops.py", "reference_triton_ops"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_epilogue_matches_gemv_then_norm_rope_store_at_qwen3_shapes(kernels, dtype):
    gemv, reference = kernels
    hidden, hq, hk, d, eps, slots_total = 1024, 16, 8, 128, 1e-6, 4096
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)

    qkv, nw, wq, wk = rnd((hq + 2 * hk) * d, hidden, scale=0.05), rnd(hidden) + 1, rnd(d) + 1, rnd(d) + 1
    half = torch.arange(0, d, 2, device="cuda").float() / d
    freqs = torch.arange(8192, device="cuda").float()[:, None] / (1e6 ** half)[None, :]
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    for tokens in (1, 2):
        x, res = rnd(tokens, hidden), rnd(tokens, hidden)
        pos = torch.randperm(8192, device="cuda", generator=g)[:tokens]
        slots = torch.randperm(slots_total, device="cuda", generator=g)[:tokens]
        caches = [[rnd(slots_total, hk, d) for _ in range(2)] for _ in range(2)]
        caches[1] = [c.clone() for c in caches[0]]

        class Cache:  # fused-qk-rope-store's kv argument: layer 0's K and V
            def __init__(self, k, v):
                self.k, self.v = [k], [v]

        y, want_res = gemv.norm_gemv(x, res, nw, eps, qkv)
        q, k, v = y.split([hq * d, hk * d, hk * d], dim=1)
        want_q = reference.qk_norm_rope_store(q.view(tokens, hq, d), k.view(tokens, hk, d), v.view(tokens, hk, d),
                                              wq, wk, eps, pos, cos_sin, Cache(*caches[0]), 0, slots)
        args = (x, res, nw, eps, qkv, None, wq, wk, pos, cos_sin, caches[1][0], caches[1][1], slots, hq, hk)
        gemv.norm_gemv_qk_rope_store(*args)  # compile and allocate the counters outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got_q, got_res = gemv.norm_gemv_qk_rope_store(*args)
        for i in range(50):  # every replay must find the counters at zero and leave them so
            got_q.fill_(float("nan"))
            caches[1][0].index_fill_(0, slots, float("nan"))
            caches[1][1].index_fill_(0, slots, float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            what = f"{tokens} tokens {dtype}, replay {i}"
            assert not gemv._head_counters[x.device].any(), what
            torch.testing.assert_close(got_res, want_res, atol=0, rtol=0, msg=what)
            torch.testing.assert_close(caches[1][1], caches[0][1], atol=0, rtol=0, msg=what)  # v as projected
            # q and k: the epilogue reduces the row's sum of squares in another layout, so rstd may round apart
            tol = {"atol": 1e-2, "rtol": 2 ** -7} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
            torch.testing.assert_close(got_q, want_q, msg=what, **tol)
            torch.testing.assert_close(caches[1][0], caches[0][0], msg=what, **tol)
