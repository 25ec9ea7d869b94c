"""The timed path's stop rule: a candidate's EOS must lie within the stop margin of the reference's top-1, and
that margin is calibrated on the reference's own timed stops (never wider than the cap)."""
from __future__ import annotations

import pytest

from seis.engine_host.client import Sampling
from seis.evaluator.config import GateThresholds
from seis.evaluator.engines import GenerationOut, ScoreOut
from seis.evaluator.schema import Calibration
from seis.evaluator.speed import TimedOutputs
from seis.evaluator.timed import stop_tolerance, timed_checks
from seis.evaluator.workloads import PromptSet

EOS, VOCAB = 99, 100
PROMPT = (1, 2, 3)
REF_OUT = [5, 6, EOS]
CAND_OUT = [5, 7, EOS]


class ScriptedReference:
    """Scores every token as its own top-1, except each output's final EOS, which lies `gaps[output]` below it."""

    def __init__(self, gaps: dict[tuple[int, ...], float]):
        self.gaps = gaps
        self.calls = 0

    def score(self, prompts, continuations, top_k):
        self.calls += 1
        out = []
        for cont in continuations:
            lps = [-1.0] * len(cont)
            lps[-1] -= self.gaps.get(tuple(cont), 0.0)
            out.append(ScoreOut(token_logprobs=lps, top_ids=[[t] for t in cont],
                                top_logprobs=[[-1.0] for _ in cont]))
        return out


def _timed(reps: int = 3) -> TimedOutputs:
    sampling = Sampling(max_new_tokens=8, ignore_eos=False, stop_token_ids=())
    sets = [PromptSet("dev-natural", ("p",), (PROMPT,), (sampling,)) for _ in range(reps)]
    outputs = {"candidate": [[GenerationOut(token_ids=CAND_OUT, finish_reason="stop")] for _ in range(reps)],
               "vanilla": [[GenerationOut(token_ids=REF_OUT, finish_reason="stop")] for _ in range(reps)]}
    return TimedOutputs(sets={"dev-natural": sets}, outputs={"dev-natural": outputs})


def _stops(ref_gap: float, cand_gap: float):
    ref = ScriptedReference({tuple(REF_OUT): ref_gap, tuple(CAND_OUT): cand_gap})
    cal = Calibration(method="test", noise={}, tolerance={"top1": 0.5, "length": 0.1}, positions=1, requests=1)
    checks = timed_checks(ref, _timed(), cal, GateThresholds(), [EOS], VOCAB, 64)
    return next(c for c in checks if c.name == "timed.dev-natural.stops")


def test_stop_tolerance_is_floor_factor_noise_and_cap():
    assert stop_tolerance([], 0.75, 1.5, 1.5) == (0.0, 0.75)
    assert stop_tolerance([0.1, 0.7, 0.2], 0.75, 1.5, 1.5) == (0.7, pytest.approx(1.05))
    assert stop_tolerance([3.0], 0.75, 1.5, 1.5) == (3.0, 1.5)


def test_a_stop_beyond_the_floor_fails_where_the_reference_stops_cleanly():
    check = _stops(ref_gap=0.0, cand_gap=0.88)
    assert not check.passed and check.value == 3.0  # every repetition's stop is named
    assert "0.88 nats below" in check.detail
    assert check.extra["stop_margin"] == 0.75 and check.extra["reference_stop_noise"] == 0.0


def test_the_references_own_stop_noise_widens_the_margin():
    """The reference chose EOS where its own scoring puts it 0.7 nats below top-1: a candidate stop 0.88 below is
    within 1.5 x that noise (an exact speculative engine on an H200 stopped 0.88 below once in 24 requests)."""
    check = _stops(ref_gap=0.7, cand_gap=0.88)
    assert check.passed, check.detail
    assert check.extra["stop_margin"] == pytest.approx(1.05)


def test_a_noisy_reference_never_lifts_the_margin_past_the_cap():
    check = _stops(ref_gap=3.0, cand_gap=2.0)
    assert not check.passed
    assert check.extra["stop_margin"] == GateThresholds().stop_cap


def test_the_reference_scores_only_its_own_natural_length_stops():
    """Fixed-length requests (EOS ignored) and outputs cut at max_new_tokens carry no stop to calibrate on."""
    timed = _timed(reps=1)
    timed.outputs["dev-natural"]["vanilla"] = [[GenerationOut(token_ids=REF_OUT, finish_reason="length")]]
    ref = ScriptedReference({tuple(CAND_OUT): 0.88, tuple(REF_OUT): 5.0})
    cal = Calibration(method="test", noise={}, tolerance={"top1": 0.5, "length": 0.5}, positions=1, requests=1)
    stops = next(c for c in timed_checks(ref, timed, cal, GateThresholds(), [EOS], VOCAB, 64)
                 if c.name == "timed.dev-natural.stops")
    assert not stops.passed and stops.extra["reference_stop_noise"] == 0.0
