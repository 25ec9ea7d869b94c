"""The `overlapped-greedy-chunks` library entry on CPU (tiny-qwen3): launching a greedy chunk before the one it
follows is read keeps E0's tokens exactly, where rows stop by length at different steps, where every row meets a
stop id inside a chunk (so the call ends with a chunk ahead, which the next call must not hand to its own
requests), and with more requests than slots, rows stopping on EOS or a stop id while others go on and others
join (a chunk ahead is booked after its rows changed)."""
from __future__ import annotations

import pytest

from seis.agents.offline.library import load_library
from seis.agents.offline.merge import with_prerequisites
from seis.agents.offline.verify import build_candidate
from seis.engine_host import EngineProcess
from seis.engine_host.client import Sampling
from seis.engine_import import ENGINE_TEMPLATE
from seis.models import resolve_model

PROMPTS = [[5, 17, 33, 100, 7], [9] * 13, list(range(3, 40)), [200]]
OPTIONS = {"device": "cpu", "max_batch_size": 4, "max_seq_len": 256, "page_size": 4}


def _calls(eng) -> dict:
    greedy = Sampling(max_new_tokens=30, ignore_eos=True)
    out = {"greedy": [g["token_ids"] for g in eng.generate(PROMPTS, greedy)]}
    # rows that stop by length at different steps, inside and at the end of chunks
    lengths = [Sampling(max_new_tokens=n, ignore_eos=True) for n in (3, 9, 14, 21)]
    out["lengths"] = [g["token_ids"] for g in eng.generate(PROMPTS, lengths)]
    # every row meets a stop id inside a chunk: the chunk launched after it is left behind, then another call
    stop = Sampling(max_new_tokens=30, ignore_eos=True, stop_token_ids=(out["greedy"][0][5],))
    out["stopped"] = [g["token_ids"] for g in eng.generate(PROMPTS[:1], stop)]
    out["after"] = [g["token_ids"] for g in eng.generate(PROMPTS[1:3], greedy)]
    # more requests than slots, some stopping on EOS or a stop id while the others go on: a chunk ahead is booked
    # after rows stopped and others joined
    out["queued"] = [g["token_ids"] for g in eng.generate(PROMPTS * 3, lengths * 3)]
    natural = [Sampling(max_new_tokens=40), stop] * (3 * len(PROMPTS) // 2)
    out["natural"] = [(g["token_ids"], g["finish_reason"]) for g in eng.generate(PROMPTS * 3, natural)]
    out["ahead"] = eng.stats().get("greedy_chunks_launched_ahead")
    return out


def _run(engine_dir, options: dict) -> dict:
    with EngineProcess(engine_dir, resolve_model("tiny-qwen3"), {**OPTIONS, **options}, timeout_s=300,
                       env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}) as eng:
        eng.build()
        return _calls(eng)


@pytest.fixture(scope="module")
def e0() -> dict:
    out = _run(ENGINE_TEMPLATE, {})
    assert out.pop("ahead") is None  # E0 has no such counter
    return out


@pytest.mark.slow
def test_chunks_launched_ahead_keep_e0_tokens(tmp_path, e0):
    t = next(t for t in load_library() if t.name == "overlapped-greedy-chunks")
    cand = _run(build_candidate(tmp_path / "candidate", with_prerequisites(t)), {})
    assert cand.pop("ahead") > 0
    stop = cand["greedy"][0][5]
    assert cand["stopped"][0] == cand["greedy"][0][: cand["greedy"][0].index(stop) + 1]  # stopped inside a chunk
    assert cand == e0


@pytest.mark.slow
@pytest.mark.parametrize("speculation", [True, False])
def test_beside_speculation_no_chunk_is_left_unread_while_it_is_on(tmp_path, e0, speculation):
    """ngram-speculation drafts from the host's tokens before every step: with it on, chunks go one at a time."""
    lib = {t.name: t for t in load_library()}
    names = ("greedy-multistep-decode", "ngram-speculation", "overlapped-greedy-chunks")
    cand = _run(build_candidate(tmp_path / "candidate", [lib[n] for n in names]), {"speculation": speculation})
    assert (cand.pop("ahead") > 0) is not speculation
    assert cand == e0
