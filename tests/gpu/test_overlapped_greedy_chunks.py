"""GPU check of the `overlapped-greedy-chunks` library entry: an fp32 engine that launches each greedy chunk before
the one it follows is read keeps E0's greedy tokens (CUDA graphs on), where rows stop by length at different steps,
where every row meets a stop id inside a chunk and a call follows, and with more requests than slots, some
stopping on EOS or a stop id while others go on.

Run on a CUDA machine: python -m pytest tests/gpu/test_overlapped_greedy_chunks.py -q
"""
from __future__ import annotations

import pytest
import torch
from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def test_fp32_engine_keeps_e0_tokens_with_graphs(tmp_path):
    from seis.engine_host.client import Sampling
    candidate = library_candidate("overlapped-greedy-chunks", tmp_path / "engine_dir")

    def run(eng):
        greedy = Sampling(max_new_tokens=45, ignore_eos=True)
        outs = {"greedy": [g["token_ids"] for g in eng.generate(PROMPTS, greedy)]}
        lengths = [Sampling(max_new_tokens=n, ignore_eos=True) for n in (3, 9, 14, 21)]
        outs["lengths"] = [g["token_ids"] for g in eng.generate(PROMPTS, lengths)]
        stop = Sampling(max_new_tokens=45, stop_token_ids=(outs["greedy"][0][10],))
        outs["stopped"] = eng.generate(PROMPTS[:1], stop)[0]["token_ids"]
        outs["after"] = [g["token_ids"] for g in eng.generate(PROMPTS[1:3], greedy)]
        outs["queued"] = [g["token_ids"] for g in eng.generate(PROMPTS * 3, lengths * 3)]
        natural = [Sampling(max_new_tokens=40), stop] * (3 * len(PROMPTS) // 2)  # some stop while others go on
        outs["natural"] = [(g["token_ids"], g["finish_reason"]) for g in eng.generate(PROMPTS * 3, natural)]
        stats = eng.stats()
        return outs, stats.get("greedy_chunks_launched_ahead"), stats["graph_replays"]

    (e0, e0_ahead, _), (cand, ahead, replays) = e0_and_candidate(candidate, run)
    assert cand == e0
    assert e0_ahead is None and ahead > 0 and replays > 0
