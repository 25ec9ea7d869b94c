"""The `fused-qk-rope-store` library entry on CPU: its Triton kernel, run by Triton's interpreter, is bitwise equal
to E0's Triton sequence (rmsnorm, rmsnorm, rope, kv.store), and its torch path is E0's torch sequence.

The check runs in a child process (tests/interpreted.py).
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from interpreted import run_interpreted  # noqa: E402
from seis.agents.offline.library import load_library  # noqa: E402
from seis.agents.offline.verify import build_candidate  # noqa: E402

CHECK = r'''
import importlib.util
import sys

import torch

from seis.engine_import import ENGINE_TEMPLATE, import_engine


def e0_module(rel, name):
    """One of E0's engine files as a standalone module (these import only torch and triton)."""
    spec = importlib.util.spec_from_file_location(name, ENGINE_TEMPLATE / "engine" / rel)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton's jit reads the kernels' source through the module
    spec.loader.exec_module(module)
    return module


import_engine(sys.argv[1])
from engine.kernels import torch_ops, triton_ops  # the candidate's
from engine.kv_cache import KVCache
from engine.model import rope_cache

e0_triton = e0_module("kernels/triton_ops.py", "e0_triton_ops")
e0_torch = e0_module("kernels/torch_ops.py", "e0_torch_ops")
E0KVCache = e0_module("kv_cache.py", "e0_kv_cache").KVCache

g = torch.Generator().manual_seed(0)
hq, hk, eps, layer, pages, page = 4, 2, 1e-6, 1, 16, 4
cases = 0
for head_dim in (16, 128):
    cs = rope_cache(head_dim, 1e6, 4096, torch.device("cpu"))
    for dtype in (torch.float32, torch.bfloat16):
        for norm in (True, False):
            for tokens in (1, 3, 7):
                qkv = torch.randn(tokens, (hq + 2 * hk) * head_dim, generator=g).to(dtype)
                wq = (torch.rand(head_dim, generator=g) + 0.5).to(dtype) if norm else None
                wk = (torch.rand(head_dim, generator=g) + 0.5).to(dtype) if norm else None
                pos = torch.randperm(4096, generator=g)[:tokens]
                slots = torch.randperm(pages * page, generator=g)[:tokens]  # scattered, distinct
                fill = [torch.randn(pages * page, hk, head_dim, generator=g).to(dtype) for _ in range(4)]
                caches = []
                for cls in (E0KVCache, KVCache, E0KVCache, KVCache):
                    kv = cls(2, pages, page, hk, head_dim, dtype, torch.device("cpu"))
                    for i in range(2):
                        kv.k[i].copy_(fill[2 * i])
                        kv.v[i].copy_(fill[2 * i + 1])
                    caches.append(kv)

                def views(x):  # as model.py slices the fused QKV output
                    q = x[:, : hq * head_dim].view(tokens, hq, head_dim)
                    k = x[:, hq * head_dim : (hq + hk) * head_dim].view(tokens, hk, head_dim)
                    v = x[:, (hq + hk) * head_dim :].view(tokens, hk, head_dim)
                    return q, k, v

                def e0_sequence(ops, kv, x):
                    q, k, v = views(x)
                    if norm:
                        q, k = ops.rmsnorm(q, wq, eps), ops.rmsnorm(k, wk, eps)
                    q, k = ops.rope(pos, q, k, cs)
                    kv.store(layer, slots, k, v)
                    return q

                outs = [e0_sequence(e0_triton, caches[0], qkv.clone()),
                        triton_ops.qk_norm_rope_store(*views(qkv.clone()), wq, wk, eps, pos, cs, caches[1], layer,
                                                      slots),
                        e0_sequence(e0_torch, caches[2], qkv.clone()),
                        torch_ops.qk_norm_rope_store(*views(qkv.clone()), wq, wk, eps, pos, cs, caches[3], layer,
                                                     slots)]
                what = f"head_dim {head_dim} {dtype} norm {norm} tokens {tokens}"
                for ref, got, kref, kgot, path in ((0, 1, caches[0], caches[1], "triton"),
                                                   (2, 3, caches[2], caches[3], "torch")):
                    assert torch.equal(outs[got], outs[ref]), f"{path} q differs: {what}"
                    assert outs[got].stride() == outs[ref].stride(), f"{path} q layout differs: {what}"
                    for i in range(2):  # layer 0 must stay as it was, layer 1 get exactly E0's writes
                        assert torch.equal(kgot.k[i], kref.k[i]), f"{path} k cache (layer {i}) differs: {what}"
                        assert torch.equal(kgot.v[i], kref.v[i]), f"{path} v cache (layer {i}) differs: {what}"
                assert not torch.equal(caches[1].k[layer], fill[2]), f"nothing written: {what}"
                # The Triton and torch sequences round differently (torch rounds cos/sin to bf16) but must agree
                # closely: the interpreted kernels computed a rotary embedding, not just the same wrong thing twice.
                tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=6e-2, rtol=2e-2)
                torch.testing.assert_close(outs[1], outs[2], **tol)
                torch.testing.assert_close(caches[1].k[layer], caches[2].k[layer], **tol)
                cases += 1
print(f"cases {cases}")
'''


@pytest.mark.slow
def test_fused_kernel_is_bitwise_e0s_sequence(tmp_path):
    t = next(t for t in load_library() if t.name == "fused-qk-rope-store")
    candidate = build_candidate(tmp_path / "candidate", [t])
    assert "cases 24" in run_interpreted(CHECK, candidate, tmp_path)
