"""GPU check of the `ngram-speculation` library entry: on CUDA with graphs (fp32 tiny-qwen3), alone and on top of
the kernel entries whose attention reads the cache before the previous kernel has finished (fused-decode-attention:
a verify step's rows of one request must not see stale K/V), greedy tokens and stops equal E0's with drafts
accepted.

Run on a CUDA machine: python -m pytest tests/gpu/test_ngram_speculation.py -q
"""
from __future__ import annotations

import pytest
import torch
from gpu_candidates import PROMPTS, e0_and_candidate

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

STACKS = {"alone": ["ngram-speculation"],
          "on the kernel stack": ["triton-gemv", "fused-decode-attention", "fused-qk-rope-store",
                                  "gate-up-silu-epilogue", "ngram-speculation"]}


def _build(names, dest):
    from seis.agents.offline.library import load_library
    from seis.agents.offline.merge import with_prerequisites
    from seis.agents.offline.verify import build_candidate
    library = {t.name: t for t in load_library()}
    stack = []
    for name in names:
        stack += [t for t in with_prerequisites(library[name]) if t not in stack]
    return build_candidate(dest, stack)


@pytest.mark.parametrize("stack", list(STACKS))
def test_speculative_engine_keeps_e0_tokens_with_graphs(stack, tmp_path):
    from seis.engine_host.client import Sampling
    candidate = _build(STACKS[stack], tmp_path / "engine_dir")

    def run(eng):
        greedy = Sampling(max_new_tokens=48, ignore_eos=True)
        free = [g["token_ids"] for g in eng.generate(PROMPTS, greedy)]
        looping = [p + out[:24] for p, out in zip(PROMPTS, free)]  # ends inside the loop greedy decode fell into
        one_by_one = [eng.generate([p], greedy)[0]["token_ids"] for p in looping]
        stopped = [eng.generate([p], Sampling(max_new_tokens=48, stop_token_ids=(out[30],)))[0]["token_ids"]
                   for p, out in zip(looping, free)]
        return free, one_by_one, stopped, eng.stats().get("accepted_draft_tokens")  # E0 has no such counter

    e0, cand = e0_and_candidate(candidate, run)
    assert cand[:3] == e0[:3]
    assert e0[3] is None and cand[3] > 0
