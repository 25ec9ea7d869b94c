"""The `qkv-rope-store-epilogue` library entry on CPU, run by Triton's interpreter: the QKV GEMV whose epilogue
normalizes, rotates and stores gives exactly what triton-gemv's GEMV followed by fused-qk-rope-store's kernel
gives -- q, both cache layers and the new residual -- and leaves its per-head counters at zero for the next launch.
The entry is built on its prerequisites (its patch is against E0 with them applied).

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
from engine.kv_cache import KVCache
from engine.model import rope_cache

fused_calls = []
fused = triton_gemv.norm_gemv_qk_rope_store
triton_gemv.norm_gemv_qk_rope_store = lambda *a, **k: fused_calls.append(1) or fused(*a, **k)

g = torch.Generator().manual_seed(0)
hq, hk, eps, layer, pages, page = 4, 2, 1e-6, 1, 16, 4
F32, BF16 = torch.float32, torch.bfloat16
# (hidden, head_dim, dtype, q/k norm, residual, bias, tokens): every launch costs the interpreter seconds, so a
# spread of combinations rather than the product. Hidden 200 leaves a tail chunk of K; 3 tokens take the unfused path.
CASES = [(64, 128, BF16, True, True, False, 1), (64, 128, F32, True, False, True, 2),
         (200, 16, BF16, False, True, True, 1), (200, 16, F32, True, True, False, 2),
         (64, 16, BF16, True, True, False, 3)]
expected_fused = 0
for hidden, head_dim, dtype, norm, with_residual, with_bias, tokens in CASES:
    rows = (hq + 2 * hk) * head_dim
    cs = rope_cache(head_dim, 1e6, 4096, torch.device("cpu"))
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    res = torch.randn(tokens, hidden, generator=g).to(dtype) if with_residual else None
    nw = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    qkv = (torch.randn(rows, hidden, generator=g) * 0.2).to(dtype)
    bias = torch.randn(rows, generator=g).to(dtype) if with_bias else None
    wq = (torch.rand(head_dim, generator=g) + 0.5).to(dtype) if norm else None
    wk = (torch.rand(head_dim, generator=g) + 0.5).to(dtype) if norm else None
    pos = torch.randperm(4096, generator=g)[:tokens]
    slots = torch.randperm(pages * page, generator=g)[:tokens]  # scattered, distinct
    fill = [torch.randn(pages * page, hk, head_dim, generator=g).to(dtype) for _ in range(4)]
    caches = []
    for _ in range(2):
        kv = KVCache(2, pages, page, hk, head_dim, dtype, torch.device("cpu"))
        for i in range(2):
            kv.k[i].copy_(fill[2 * i])
            kv.v[i].copy_(fill[2 * i + 1])
        caches.append(kv)
    # E0's add-RMSNorm above GEMV_MAX_TOKENS works in place: each path gets its own copies
    fresh = lambda: (x.clone(), res.clone() if res is not None else None)

    # what the candidate's prerequisites do: the QKV GEMV, then the norm-RoPE-store kernel on views of its output
    y, want_res = triton_ops.norm_linear(*fresh(), nw, eps, qkv, bias)
    want_q = triton_ops.qk_norm_rope_store(*torch_ops.split_qkv(y, hq, hk), wq, wk, eps, pos, cs, caches[0], layer,
                                           slots)
    got_q, got_res = triton_ops.norm_linear_qk_rope_store(*fresh(), nw, eps, qkv, bias, wq, wk, pos, cs, caches[1],
                                                          layer, slots, hq, hk)
    pairs = [("q", got_q, want_q), ("residual", got_res, want_res)]
    pairs += [(f"{name}[{i}]", getattr(caches[1], name)[i], getattr(caches[0], name)[i]) for name in "kv" for i in range(2)]
    for name, a, b in pairs:
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), \
            (hidden, head_dim, dtype, norm, with_residual, with_bias, tokens, name, (a.float() - b.float()).abs().max())
    counters = triton_gemv._head_counters.get(torch.device("cpu"))
    assert counters is None or not counters.any(), counters  # zero again for the next launch
    expected_fused += tokens <= triton_gemv.GEMV_MAX_TOKENS
    # the torch backend's composition is E0's sequence
    kv_a, kv_b = (KVCache(2, pages, page, hk, head_dim, dtype, torch.device("cpu")) for _ in range(2))
    y, r = torch_ops.norm_linear(*fresh(), nw, eps, qkv, bias)
    tq = torch_ops.qk_norm_rope_store(*torch_ops.split_qkv(y, hq, hk), wq, wk, eps, pos, cs, kv_a, layer, slots)
    uq, ur = torch_ops.norm_linear_qk_rope_store(*fresh(), nw, eps, qkv, bias, wq, wk, pos, cs, kv_b, layer, slots,
                                                 hq, hk)
    assert torch.equal(tq, uq) and torch.equal(r, ur) and torch.equal(kv_a.k[layer], kv_b.k[layer])
    assert torch.equal(kv_a.v[layer], kv_b.v[layer])
assert len(fused_calls) == expected_fused == 4  # every case of up to GEMV_MAX_TOKENS took the fused launch
print(f"cases {len(CASES)}")
'''


@pytest.mark.slow
def test_qkv_gemv_epilogue_equals_gemv_then_norm_rope_store(tmp_path):
    library = {t.name: t for t in load_library()}
    t = library["qkv-rope-store-epilogue"]
    assert t.prerequisites == ("fused-qk-rope-store", "gate-up-silu-epilogue")
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    out = run_interpreted(CHECK, candidate, tmp_path, timeout_s=600)
    assert "cases 5" in out
