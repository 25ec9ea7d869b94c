"""GPU checks of the `fused-decode-attention` library entry: its compiled one-launch kernel (split-KV, merge by the
last split, programmatic dependent launch on sm_90+), on the CUDA cores and on tensor cores (mma), against SDPA at
Qwen3-0.6B shapes, counters back at zero, inside a CUDA graph replayed repeatedly; the engine's own launch of it
for bf16 caches (tensor cores on sm_80+) against E0's SDPA path; and an fp32 engine with it keeps E0's greedy tokens
(CUDA graphs on).

Run on a CUDA machine: python -m pytest tests/gpu/test_fused_decode_attention.py -q
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


# In a child process: a process hosts one engine directory, and other test files import E0's.
ENGINE_CHECK = r"""
import sys

import torch

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.attention import TorchAttention, TritonAttention
from engine.batch import ForwardBatch
from engine.kv_cache import KVCache

hq, hk, d, page, layers, dev = 16, 8, 128, 16, 2, torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
kv = KVCache(layers, 8 * 64 + 1, page, hk, d, torch.bfloat16, dev)
for t in kv.k + kv.v:
    t.normal_(generator=g)
attn, ref = TritonAttention(hq, hk, d, 8, dev), TorchAttention(hq, hk, d)
for lens in ([356], [1, 40, 700], [129] * 5 + [16, 17, 1000]):
    bs = len(lens)
    page_table = (torch.randperm(8 * 64, generator=g, device=dev).to(torch.int32) + 1).view(8, 64)[:bs]
    seq = torch.tensor(lens, dtype=torch.int32, device=dev)
    batch = ForwardBatch(is_decode=True, input_ids=torch.zeros(bs, dtype=torch.int64, device=dev),
                         positions=seq.long() - 1, out_slots=torch.zeros(bs, dtype=torch.int64, device=dev),
                         seq_lens=seq, page_table=page_table, logit_rows=torch.arange(bs, device=dev), cuda_graph=True)
    q = torch.randn(bs, hq, d, generator=g, device=dev).to(torch.bfloat16)
    outs = [None] * layers
    attn.decode(0, q, batch, kv)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(layers):
            outs[layer] = attn.decode(layer, q, batch, kv)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        for layer in range(layers):
            err = (outs[layer].float() - ref.decode(layer, q, batch, kv).float()).abs().max().item()
            assert err < 2e-2, f"lens {lens} layer {layer}: max abs error {err}"
    assert int(attn.counters.abs().sum()) == 0
print("tensor cores" if attn.tensor_cores else "cuda cores")
"""


def test_the_engines_bf16_launch_matches_sdpa(candidate):
    """TritonAttention.decode as the engine calls it (its splits, tile and path) at 1, 3 and 8 requests."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", ENGINE_CHECK, str(candidate)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    tensor_cores = torch.cuda.get_device_capability()[0] >= 8
    assert done.stdout.strip() == ("tensor cores" if tensor_cores else "cuda cores")


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
