"""GPU checks of the `fused-decode-attention` library entry: its compiled one-launch kernel (split-KV, merge by the
last split, programmatic dependent launch on sm_90+) against SDPA at Qwen3-0.6B shapes, counters back at zero,
inside a CUDA graph replayed repeatedly; and an fp32 engine with it keeps E0's greedy tokens (CUDA graphs on).
`fused-rope-decode-attention` (q/k norm, RoPE and KV write inside that kernel): against fused-qk-rope-store's
kernel followed by the plain decode kernel, under graph replays, and the same engine check.

Run on a CUDA machine: python -m pytest tests/gpu/test_fused_decode_attention.py -q
"""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from seis.engine_import import ENGINE_TEMPLATE
from seis.models import resolve_model

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

NAMES = ("fused-decode-attention", "fused-rope-decode-attention")


def _build(name, tmp_path_factory):
    from seis.agents.offline.library import load_library
    from seis.agents.offline.verify import build_candidate
    t = next(t for t in load_library() if t.name == name)
    return build_candidate(tmp_path_factory.mktemp("candidate") / "engine_dir", [t])


def _load(candidate, rel, name):
    spec = importlib.util.spec_from_file_location(name, candidate / rel)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # triton's jit (and dataclasses) read the module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=NAMES)
def candidate(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    return _load(_build(NAMES[0], tmp_path_factory), "engine/kernels/triton_attention.py", "fda_triton_attention")


@pytest.fixture(scope="module")
def rope_kernels(tmp_path_factory):
    root = _build(NAMES[1], tmp_path_factory)
    return (_load(root, "engine/kernels/triton_attention.py", "frda_triton_attention"),
            _load(root, "engine/kernels/triton_ops.py", "frda_triton_ops"))


def _sdpa(q, k, v, page_table, lens, page):
    out = []
    for b, length in enumerate(lens):
        slots = (page_table[b].long()[:, None] * page + torch.arange(page, device=q.device)).flatten()[:length]
        kk, vv = k[slots].transpose(0, 1)[None], v[slots].transpose(0, 1)[None]
        out.append(torch.nn.functional.scaled_dot_product_attention(q[b][None, :, None], kk, vv,
                                                                    enable_gqa=True)[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize("bs, splits, block_n", [(1, 32, 16), (4, 8, 32), (16, 2, 32)])
def test_kernel_matches_sdpa_under_graph_replays(kernel, bs, splits, block_n):
    hq, hk, d, page = 16, 8, 128, 16
    g = torch.Generator(device="cuda").manual_seed(bs)
    lens = [356] if bs == 1 else [1, 17, 356, 4000] + [129] * (bs - 4)
    width = -(-max(lens) // page)
    k = torch.randn(bs * width * page + page, hk, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn_like(k)
    page_table = (torch.randperm(bs * width, device="cuda", generator=g).to(torch.int32) + 1).view(bs, width)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(bs, hq, d, device="cuda", generator=g).to(torch.bfloat16)
    out = torch.empty_like(q)
    mid_out = torch.empty(bs, hq, splits, d, device="cuda")
    mid_lse = torch.empty(bs, hq, splits, device="cuda")
    counters = torch.zeros(bs * hk, dtype=torch.int32, device="cuda")

    def run():
        kernel.paged_decode(q, k, v, page_table, seq, out, mid_out, mid_lse, counters, page, block_n=block_n)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(4):  # back to back, as layers run: each launch relies on the last having reset the counters
            run()
    want = _sdpa(q, k, v, page_table, lens, page).float()
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert (out.float() - want).abs().max().item() < 2e-2
        assert int(counters.abs().sum()) == 0


def test_fp32_engine_keeps_e0_tokens_with_graphs(candidate):
    from seis.engine_host import EngineProcess
    from seis.engine_host.client import Sampling
    prompts = [[5, 17, 33, 100, 7], [9] * 40, list(range(3, 300)), [200]]
    options = {"device": "cuda", "dtype": "float32", "max_batch_size": 4, "max_seq_len": 512}
    outs = []
    for engine_dir in (ENGINE_TEMPLATE, candidate):
        with EngineProcess(engine_dir, resolve_model("tiny-qwen3"), options, timeout_s=600) as eng:
            eng.build()
            outs.append([g["token_ids"] for g in eng.generate(prompts, Sampling(max_new_tokens=48,
                                                                                 ignore_eos=True))])
            single = eng.generate(prompts[2:3], Sampling(max_new_tokens=48, ignore_eos=True))[0]["token_ids"]
            assert single == outs[-1][2]  # batch of one (one split layout) and the batch of four agree
            assert eng.stats()["graph_replays"] > 0
    assert outs[1] == outs[0]


class _OneLayerCache:  # the part of KVCache that qk_norm_rope_store uses
    def __init__(self, k, v):
        self.k, self.v = [k], [v]


@pytest.mark.parametrize("bs", [1, 4])
def test_rope_inside_the_kernel_matches_the_separate_launch_under_graph_replays(rope_kernels, bs):
    attention, ops = rope_kernels
    hq, hk, d, page, splits = 16, 8, 128, 16, 32 if bs == 1 else 8
    g = torch.Generator(device="cuda").manual_seed(bs)
    lens = [356] if bs == 1 else [1, 17, 356, 1600]
    width = -(-max(lens) // page)
    k_cache = torch.randn(bs * width * page + page, hk, d, device="cuda", generator=g).to(torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    page_table = (torch.randperm(bs * width, device="cuda", generator=g).to(torch.int32) + 1).view(bs, width)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    pos = seq.long() - 1
    slots = page_table.long().gather(1, (pos // page)[:, None])[:, 0] * page + pos % page
    qkv = (torch.randn(bs, (hq + 2 * hk) * d, device="cuda", generator=g) * 3).to(torch.bfloat16)
    q, k, v = (qkv[:, a * d : b * d].view(bs, -1, d) for a, b in ((0, hq), (hq, hq + hk), (hq + hk, hq + 2 * hk)))
    qw, kw = ((torch.rand(d, device="cuda", generator=g) + 0.5).to(torch.bfloat16) for _ in range(2))
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    angles = torch.arange(4096, device="cuda").float()[:, None] * inv[None]
    cos_sin = torch.cat((angles.cos(), angles.sin()), -1)
    scratch = (torch.empty(bs, hq, splits, d, device="cuda"), torch.empty(bs, hq, splits, device="cuda"))
    counters = torch.zeros(bs * hk, dtype=torch.int32, device="cuda")

    two = _OneLayerCache(k_cache.clone(), v_cache.clone())
    q_rot = ops.qk_norm_rope_store(q, k, v, qw, kw, 1e-6, pos, cos_sin, two, 0, slots)
    want = torch.empty(bs, hq, d, dtype=torch.bfloat16, device="cuda")
    attention.paged_decode(q_rot, two.k[0], two.v[0], page_table, seq, want, *scratch, counters, page)

    k_one, v_one = k_cache.clone(), v_cache.clone()
    out = torch.empty(bs, hq, d, dtype=torch.bfloat16, device="cuda")
    rope = attention.RopeInputs(k, v, qw, kw, 1e-6, pos, slots, cos_sin)

    def run():
        attention.paged_decode(q, k_one, v_one, page_table, seq, out, *scratch, counters, page, rope=rope)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(4):
            run()
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        # rounding-level: the compiled norm reduces a [heads, D] tile, the separate kernel one row
        assert (out.float() - want.float()).abs().max().item() < 3e-2
        assert (k_one.float() - two.k[0].float()).abs().max().item() < 0.07  # one bf16 unit at |k| < 16
        assert torch.equal(v_one, two.v[0])
        assert int(counters.abs().sum()) == 0
