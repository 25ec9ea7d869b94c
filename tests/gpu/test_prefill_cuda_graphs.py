"""GPU checks of the `prefill-cuda-graphs` library entry: single requests prefill from the captured graphs, and an
fp32 engine with it keeps E0's greedy tokens (prompts between captured lengths, one past the largest).

Run on a CUDA machine: python -m pytest tests/gpu/test_prefill_cuda_graphs.py -q
"""
from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate  # noqa: E402


def test_fp32_engine_keeps_e0_tokens_with_prefill_graphs(tmp_path):
    from seis.engine_host.client import Sampling

    candidate = library_candidate("prefill-cuda-graphs", tmp_path / "engine_dir")
    # tiny-qwen3 at max_seq_len 512: graphs up to 512 prompt tokens; 500 tokens + 8 new still fit one.
    prompts = PROMPTS + [[1 + i % 300 for i in range(500)]]

    def run(eng):
        out = [eng.generate([p], Sampling(max_new_tokens=8, ignore_eos=True))[0]["token_ids"] for p in prompts]
        out.append([g["token_ids"] for g in eng.generate(PROMPTS, Sampling(max_new_tokens=8, ignore_eos=True))])
        return out, eng.stats()

    (e0, e0_stats), (cand, stats) = e0_and_candidate(candidate, run)
    assert cand == e0
    assert e0_stats.get("prefill_graph_replays") is None
    assert stats["prefill_graph_sizes"][-1] == 512
    assert stats["prefill_graph_replays"] == len(prompts)  # single requests only: the batched call is eager
