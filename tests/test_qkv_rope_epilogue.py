"""The `qkv-rope-epilogue` library entry on CPU, run by Triton's interpreter: the QKV GEMV whose epilogue does the
q/k norm, RoPE and KV write gives the q heads and cache contents of triton-gemv's GEMV followed by
fused-qk-rope-store's kernel, returns the same residual, and leaves its per-head counters at zero after every
launch. The entry is built on its prerequisites (its patch is against E0 with them applied).

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
from engine.kernels import triton_gemv, triton_ops  # the candidate's
from engine.kv_cache import KVCache
from engine.model import rope_cache

fused_calls = []
fused = triton_gemv.norm_gemv_rope_store
triton_gemv.norm_gemv_rope_store = lambda *a, **k: fused_calls.append(1) or fused(*a, **k)

g = torch.Generator().manual_seed(0)
hidden, eps, layer, pages, page = 64, 1e-6, 1, 16, 4
cases = 0
# (q heads, kv heads, head dim, dtypes, with and without q/k norms, token counts)
for hq, hk, head_dim, dtypes, norms, counts in ((4, 2, 32, (torch.float32, torch.bfloat16), (True, False), (1, 3)),
                                              (2, 1, 128, (torch.bfloat16,), (True,), (3,))):
    cs = rope_cache(head_dim, 1e6, 4096, torch.device("cpu"))
    n = (hq + 2 * hk) * head_dim
    for dtype in dtypes:
        for norm in norms:
            for tokens in counts:
                x = torch.randn(tokens, hidden, generator=g).to(dtype)
                res = torch.randn(tokens, hidden, generator=g).to(dtype)
                nw = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
                w = (torch.randn(n, hidden, generator=g) * 0.1).to(dtype)
                wq = (torch.rand(head_dim, generator=g) + 0.5).to(dtype) if norm else None
                wk = (torch.rand(head_dim, generator=g) + 0.5).to(dtype) if norm else None
                pos = torch.randperm(4096, generator=g)[:tokens]
                slots = torch.randperm(pages * page, generator=g)[:tokens]  # scattered, distinct
                fill = [torch.randn(pages * page, hk, head_dim, generator=g).to(dtype) for _ in range(2)]
                caches = []
                for _ in range(2):
                    kv = KVCache(2, pages, page, hk, head_dim, dtype, torch.device("cpu"))
                    for i in range(2):
                        kv.k[i].copy_(fill[0])
                        kv.v[i].copy_(fill[1])
                    caches.append(kv)
                # the reference: the two kernels the epilogue replaces
                qkv, want_res = triton_ops.norm_linear(x, res, nw, eps, w)
                q, k, v = (qkv[:, : hq * head_dim].view(tokens, hq, head_dim),
                           qkv[:, hq * head_dim : (hq + hk) * head_dim].view(tokens, hk, head_dim),
                           qkv[:, (hq + hk) * head_dim :].view(tokens, hk, head_dim))
                want_q = triton_ops.qk_norm_rope_store(q, k, v, wq, wk, eps, pos, cs, caches[0], layer, slots)
                for launch in range(2):  # the second launch relies on the first having reset the counters
                    got_q, got_res = triton_ops.norm_linear_qk_rope_store(
                        x, res, nw, eps, w, None, (hq, hk, head_dim), wq, wk, pos, cs, caches[1], layer, slots)
                    counters = triton_gemv._head_counters(x.device, hq + 2 * hk)
                    assert int(counters.abs().sum()) == 0, counters.tolist()
                tol = 1e-6 if dtype == torch.float32 else 1e-2
                for name, a, b in (("q", got_q, want_q), ("residual", got_res, want_res),
                                   ("k cache", caches[1].k[layer], caches[0].k[layer]),
                                   ("v cache", caches[1].v[layer], caches[0].v[layer]),
                                   ("other layer", caches[1].k[0], caches[0].k[0])):
                    err = (a.float() - b.float()).abs().max().item()
                    assert a.shape == b.shape and err <= tol, (hq, hk, head_dim, dtype, norm, tokens, name, err)
                cases += 1
assert len(fused_calls) == 2 * cases  # every launch took the epilogue
print(f"cases {cases}")
'''


def test_qkv_gemv_epilogue_matches_gemv_then_rope_store(tmp_path):
    library = {t.name: t for t in load_library()}
    t = library["qkv-rope-epilogue"]
    assert set(t.prerequisites) == {"triton-gemv", "fused-qk-rope-store"}
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    out = run_interpreted(CHECK, candidate, tmp_path, timeout_s=600)
    assert "cases 9" in out
