"""The `ngram-speculation` library entry on CPU (tiny-qwen3, float32): its drafts follow the latest earlier
occurrence of the context's last n-gram, a verify step keeps exactly the tokens greedy decode gives, and the engine
with it generates E0's tokens and finish reasons (stops and length limits falling inside accepted drafts, one
request at a time and more requests than batch slots) while actually accepting drafts."""
from __future__ import annotations

import importlib.util

import pytest

from seis.agents.offline.library import load_library
from seis.agents.offline.merge import with_prerequisites
from seis.agents.offline.verify import build_candidate
from seis.engine_host import EngineProcess
from seis.engine_host.client import Sampling
from seis.engine_import import ENGINE_TEMPLATE
from seis.models import resolve_model

ENTRY = next(t for t in load_library() if t.name == "ngram-speculation")
OPTIONS = {"device": "cpu", "max_batch_size": 8, "max_seq_len": 256, "page_size": 4}
PROMPTS = [[5, 17, 33, 100, 7], [9] * 13, list(range(3, 40)), [200], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [11, 12]]


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return build_candidate(tmp_path_factory.mktemp("speculation") / "engine", with_prerequisites(ENTRY))


def _speculation_module(candidate):
    spec = importlib.util.spec_from_file_location("speculation", candidate / "engine" / "speculation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # no imports of the engine: loadable on its own
    return module


def test_drafts_copy_what_followed_the_latest_earlier_ngram(candidate):
    sp = _speculation_module(candidate)
    d = sp.NgramDrafter()
    assert d.draft([4, 5, 6], 5) == []                                  # nothing recurs
    assert d.draft([4, 5, 6, 7, 4, 5], 3) == [6, 7, 4]                  # (4, 5) occurred: what followed it
    assert d.draft([4, 5, 6, 7, 4, 5, 9, 4, 5], 2) == [9, 4]            # the latest occurrence wins
    assert d.draft([4, 5, 6, 7, 4, 5, 9, 4, 5, 9, 4, 5], 5) == [9, 4, 5, 9, 4]  # past the end: the cycle again
    longest = sp.NgramDrafter()
    # the 3-gram (1, 2, 3) recurs only at the start; the 2-gram (2, 3) also later: the longer match decides
    assert longest.draft([1, 2, 3, 8, 0, 2, 3, 5, 1, 2, 3], 1) == [8]
    assert sp.NgramDrafter().draft([7, 7, 7], 4) == [7, 7, 7, 7]
    assert sp.NgramDrafter().draft([7, 7, 7], 0) == []
    resting = sp.NgramDrafter()
    resting.resting = True
    assert resting.draft([7, 7, 7], 4) == [] and resting.draft([7, 7, 7, 7], 4) == [7, 7, 7, 7]


def test_a_verify_step_keeps_the_greedy_tokens(candidate):
    accepted = _speculation_module(candidate).accepted
    assert accepted([3, 1, 2], [3, 1, 2, 6]) == [3, 1, 2, 6]  # all drafted tokens agree: plus the one after
    assert accepted([3, 1, 2], [3, 1, 9, 6]) == [3, 1, 9]     # up to the first disagreement, then the argmax
    assert accepted([3, 1, 2], [4, 1, 2, 6]) == [4]           # rejected whole: still one token
    assert accepted([], [5]) == [5]


def _generate(engine_dir, requests, one_by_one: bool, **options):
    prompts, sampling = zip(*requests)
    with EngineProcess(engine_dir, resolve_model("tiny-qwen3"), {**OPTIONS, **options}, timeout_s=300,
                       env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}) as eng:
        eng.build()
        if one_by_one:
            outs = [eng.generate([p], s)[0] for p, s in requests]
        else:
            outs = eng.generate(list(prompts), list(sampling))
        return [(o["token_ids"], o["finish_reason"]) for o in outs], eng.stats()


@pytest.mark.slow
def test_greedy_generation_equals_e0_with_drafts_accepted(candidate):
    free, _ = _generate(ENGINE_TEMPLATE, [(p, Sampling(max_new_tokens=40, ignore_eos=True)) for p in PROMPTS], False)
    # Prompts that end inside the loops E0 fell into: drafts are accepted from the first step. Stop ids are tokens
    # of those loops (so they first appear in the output inside an accepted draft); the length limits cut drafts.
    looping = [p + out[:24] for p, (out, _) in zip(PROMPTS, free)]
    requests = [(p, Sampling(max_new_tokens=40, ignore_eos=True)) for p in PROMPTS + looping]
    requests += [(p, Sampling(max_new_tokens=n, ignore_eos=True)) for p in looping[:3] for n in (1, 2, 5, 11)]
    requests += [(p, Sampling(max_new_tokens=40, stop_token_ids=(out[30 + i],)))
                 for i, (p, (out, _)) in enumerate(zip(looping, free))]
    requests += [(p, Sampling(max_new_tokens=60)) for p in PROMPTS]  # the model's own EOS
    for one_by_one in (True, False):  # batch 1 (drafts of 7), and more requests than the 8 slots
        want, _ = _generate(ENGINE_TEMPLATE, requests, one_by_one)
        got, stats = _generate(candidate, requests, one_by_one)
        assert got == want
        assert stats["verify_steps"] > 0 and stats["accepted_draft_tokens"] > stats["verify_steps"]
        assert any(reason == "stop" for _, reason in got)


def test_speculation_off_decodes_without_drafts(candidate):
    requests = [(p + p, Sampling(max_new_tokens=30, ignore_eos=True)) for p in PROMPTS]  # repeats: drafts if on
    want, _ = _generate(ENGINE_TEMPLATE, requests, True, speculation=False)  # E0 ignores the option
    got, stats = _generate(candidate, requests, True, speculation=False)
    assert got == want and stats["verify_steps"] == 0 and stats["draft_tokens"] == 0
    _, on = _generate(candidate, requests, True)
    assert on["verify_steps"] > 0
