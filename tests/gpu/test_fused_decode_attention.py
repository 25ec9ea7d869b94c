"""GPU checks of the `fused-decode-attention` library entry: its compiled one-launch kernel (split-KV, merge by the
last split, programmatic dependent launch on sm_90+) against SDPA at Qwen3-0.6B shapes, counters back at zero,
inside a CUDA graph replayed repeatedly; and an fp32 engine with it keeps E0's greedy tokens (CUDA graphs on).

Run on a CUDA machine: python -m pytest tests/gpu/test_fused_decode_attention.py -q
"""
from __future__ import annotations

import pytest
import torch

from seis.engine_import import ENGINE_TEMPLATE
from seis.models import resolve_model

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

NAME = "fused-decode-attention"


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    from seis.agents.offline.library import load_library
    from seis.agents.offline.verify import build_candidate
    t = next(t for t in load_library() if t.name == NAME)
    return build_candidate(tmp_path_factory.mktemp("candidate") / "engine_dir", [t])


@pytest.fixture(scope="module")
def kernel(candidate):
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location("candidate_triton_attention",
                                                  candidate / "engine" / "kernels" / "triton_attention.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # triton's jit reads the kernel's source through the module
    spec.loader.exec_module(module)
    return module


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
