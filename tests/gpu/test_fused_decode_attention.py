"""GPU checks of the `fused-decode-attention` library entry: its compiled one-launch kernel (split-KV, merge by the
last split, programmatic dependent launch on sm_90+), on the CUDA cores and on tensor cores (mma), against SDPA at
Qwen3-0.6B shapes, counters back at zero, inside a CUDA graph replayed repeatedly; and an fp32 engine with it keeps
E0's greedy tokens (CUDA graphs on).

Run on a CUDA machine: python -m pytest tests/gpu/test_fused_decode_attention.py -q
"""
from __future__ import annotations

import pytest
import torch
from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate, load_module

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

NAME = "fused-decode-attention"


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate(NAME, tmp_path_factory.mktemp("candidate") / "engine_dir")


@pytest.fixture(scope="module")
def kernel(candidate):
    return load_module(candidate, "engine/kernels/triton_attention.py", "candidate_triton_attention")


def _sdpa(q, k, v, page_table, lens, page):
    out = []
    for b, length in enumerate(lens):
        slots = (page_table[b].long()[:, None] * page + torch.arange(page, device=q.device)).flatten()[:length]
        kk, vv = k[slots].transpose(0, 1)[None], v[slots].transpose(0, 1)[None]
        out.append(torch.nn.functional.scaled_dot_product_attention(q[b][None, :, None], kk, vv,
                                                                    enable_gqa=True)[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize("bs, splits, block_n, mma", [(1, 32, 16, False), (4, 8, 32, False), (16, 2, 32, False),
                                                      (1, 32, 16, True), (4, 8, 64, True), (16, 2, 32, True)])
def test_kernel_matches_sdpa_under_graph_replays(kernel, bs, splits, block_n, mma):
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
        kernel.paged_decode(q, k, v, page_table, seq, out, mid_out, mid_lse, counters, page, block_n=block_n,
                            mma=mma)

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
    from seis.engine_host.client import Sampling
    greedy = Sampling(max_new_tokens=48, ignore_eos=True)

    def run(eng):
        outs = [g["token_ids"] for g in eng.generate(PROMPTS, greedy)]
        single = eng.generate(PROMPTS[2:3], greedy)[0]["token_ids"]
        assert single == outs[2]  # batch of one (one split layout) and the batch of four agree
        assert eng.stats()["graph_replays"] > 0
        return outs

    e0, cand = e0_and_candidate(candidate, run)
    assert cand == e0
