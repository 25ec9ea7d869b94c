"""GPU checks of the library entries that have no kernel tests of their own: with each, an fp32 tiny-qwen3 engine
on CUDA with graphs keeps E0's greedy tokens (one batched call and single requests) and E0's scores
(batched-scoring changes score(); fused-qk-norm and splitkv-by-batch-size change kernels; decode-pinned-metadata
changes how decode inputs reach the device).

Run on a CUDA machine: python -m pytest tests/gpu/test_library_entries.py -q
"""
from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate  # noqa: E402


@pytest.mark.parametrize("name", ["batched-scoring", "decode-pinned-metadata", "fused-qk-norm",
                                  "splitkv-by-batch-size"])
def test_fp32_engine_with_the_entry_keeps_e0_outputs(name, tmp_path):
    from seis.engine_host.client import Sampling

    candidate = library_candidate(name, tmp_path / "engine_dir")
    sampling = Sampling(max_new_tokens=16, ignore_eos=True)

    def run(eng):
        batched = [g["token_ids"] for g in eng.generate(PROMPTS, sampling)]
        single = [eng.generate([p], sampling)[0]["token_ids"] for p in PROMPTS]
        scores = eng.score(PROMPTS, batched, top_k=3)
        return batched, single, scores, eng.stats()

    (e0, e0_single, e0_scores, _), (got, got_single, scores, stats) = e0_and_candidate(candidate, run)
    assert got == e0 and got_single == e0_single
    assert stats["graph_replays"] > 0
    for want, have in zip(e0_scores, scores, strict=True):
        assert have["top_ids"] == want["top_ids"]
        torch.testing.assert_close(torch.tensor(have["token_logprobs"]), torch.tensor(want["token_logprobs"]),
                                   atol=1e-4, rtol=0)
