"""GPU checks of the `attention-qk-prologue` library entry: the compiled split-KV decode kernel with NewTokens (q/k
norm, RoPE and the K/V write in its prologue, programmatic dependent launch on sm_90+) against the two kernels it
replaces, at Qwen3-0.6B shapes and 1, 8 and 32 requests, inside a CUDA graph replayed repeatedly; and an fp32 engine
with it keeps E0's greedy tokens (CUDA graphs on, greedy chunks, where the prologue runs).

Run on a CUDA machine: python -m pytest tests/gpu/test_attention_qk_prologue.py -q
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

NAME = "attention-qk-prologue"


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate(NAME, tmp_path_factory.mktemp("candidate") / "engine_dir")


# In a child process: a process hosts one engine directory, and other test files import E0's.
KERNEL_CHECK = r"""
import sys

import torch

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.attention import TritonAttention
from engine.attention_backend import NewTokens
from engine.batch import ForwardBatch
from engine.kernels.triton_ops import qk_norm_rope_store
from engine.kv_cache import KVCache
from engine.model import rope_cache

hq, hk, d, page, layers, dev, dtype = 16, 8, 128, 16, 4, torch.device("cuda"), torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)
cos_sin = rope_cache(d, 1e6, 4096, dev)
q_norm, k_norm = [(1 + 0.1 * torch.randn(d, generator=g, device=dev)).to(dtype) for _ in range(2)]
for lens in ([356], [1, 17, 40, 129, 700, 1000, 16, 2000], [129] * 16 + list(range(200, 3400, 200))):
    bs = len(lens)
    width = -(-max(lens) // page)
    page_table = (torch.randperm(bs * width, generator=g, device=dev).to(torch.int32) + 1).view(bs, width)
    seq = torch.tensor(lens, dtype=torch.int32, device=dev)
    pos = seq.long() - 1
    slots = page_table.long().gather(1, (pos // page)[:, None])[:, 0] * page + pos % page
    batch = ForwardBatch(is_decode=True, input_ids=torch.zeros(bs, dtype=torch.int64, device=dev), positions=pos,
                         out_slots=slots, seq_lens=seq, page_table=page_table,
                         logit_rows=torch.arange(bs, device=dev), cuda_graph=True, distinct_requests=True)
    qkv = torch.randn(layers, bs, (hq + 2 * hk) * d, generator=g, device=dev).to(dtype)
    caches = torch.randn(2, layers, bs * width * page + page, hk, d, generator=g, device=dev).to(dtype)
    results = []
    for fused in (False, True):
        attn = TritonAttention(hq, hk, d, bs, dev)
        kv = KVCache(layers, bs * width + 1, page, hk, d, dtype, dev)
        outs = [None] * layers

        def step():  # layers back to back, as a decode graph runs them
            for layer in range(layers):
                x = qkv[layer].clone()  # the QKV projection's output, fresh in every replay
                q = x[:, : hq * d].view(bs, hq, d)
                k = x[:, hq * d : (hq + hk) * d].view(bs, hk, d)
                v = x[:, (hq + hk) * d :].view(bs, hk, d)
                if fused:
                    q = NewTokens(q, k, v, q_norm, k_norm, 1e-6, pos, cos_sin, slots)
                else:
                    q = qk_norm_rope_store(q, k, v, q_norm, k_norm, 1e-6, pos, cos_sin, kv, layer, slots)
                outs[layer] = attn.forward(layer, q, batch, kv)

        for layer in range(layers):
            kv.k[layer].copy_(caches[0, layer]), kv.v[layer].copy_(caches[1, layer])
        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for _ in range(3):
            for layer in range(layers):
                kv.k[layer].copy_(caches[0, layer]), kv.v[layer].copy_(caches[1, layer])
            graph.replay()
            torch.cuda.synchronize()
        assert int(attn.counters.abs().sum()) == 0
        results.append(([o.float() for o in outs], [c.float() for c in kv.k + kv.v]))
    (outs0, cache0), (outs1, cache1) = results
    for a, b in zip(cache0, cache1):  # RoPE's multiply-adds may contract differently: one bf16 unit at most
        assert ((a - b).abs() <= a.abs() * 2 ** -7 + 1e-6).all(), f"lens {lens}: caches differ beyond rounding"
    err = max((a - b).abs().max().item() for a, b in zip(outs0, outs1))
    assert err < 2e-2, f"lens {lens}: attention differs by {err}"
    print(f"{bs} requests: max abs difference {err:.2e}")
"""


def test_the_compiled_prologue_matches_the_two_kernels_it_replaces(candidate):
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK, str(candidate)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("requests: max abs difference") == 3, done.stdout


def test_fp32_engine_keeps_e0_tokens_with_graphs(candidate):
    from seis.engine_host.client import Sampling
    greedy = Sampling(max_new_tokens=48, ignore_eos=True)

    def run(eng):
        outs = [g["token_ids"] for g in eng.generate(PROMPTS, greedy)]
        assert eng.generate(PROMPTS[2:3], greedy)[0]["token_ids"] == outs[2]
        assert eng.stats()["graph_replays"] > 0
        return outs

    e0, cand = e0_and_candidate(candidate, run)
    assert cand == e0
