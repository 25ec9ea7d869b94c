"""The timed path's stop rule: a candidate's EOS must lie within the stop margin of the reference's top-1, and
that margin is calibrated on the reference's own timed stops and on the model's EOS row (never wider than the
cap)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from seis.engine_host.client import Sampling
from seis.evaluator.engines import GenerationOut, ScoreOut
from seis.evaluator.errors import GateInputError
from seis.evaluator.gate_config import GateThresholds
from seis.evaluator.logit_scale import eos_gap_scale
from seis.evaluator.schema import Calibration
from seis.evaluator.speed import TimedOutputs
from seis.evaluator.checks import EarlyEnds, early_ends
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


def _stops(ref_gap: float, cand_gap: float, eos_scale: float = 1.0):
    ref = ScriptedReference({tuple(REF_OUT): ref_gap, tuple(CAND_OUT): cand_gap})
    cal = Calibration(method="test", noise={}, tolerance={"top1": 0.5, "length": 0.1}, positions=1, requests=1)
    checks = timed_checks(ref, _timed(), cal, GateThresholds(), [EOS], VOCAB, 64, eos_scale)
    return next(c for c in checks if c.name == "timed.dev-natural.stops")


def test_stop_tolerance_is_floor_factor_noise_and_cap():
    assert stop_tolerance([], 0.75, 1.5, 1.5) == (0.0, 0.75)
    assert stop_tolerance([0.1, 0.7, 0.2], 0.75, 1.5, 1.5) == (0.7, pytest.approx(1.05))
    assert stop_tolerance([3.0], 0.75, 1.5, 1.5) == (3.0, 1.5)
    assert stop_tolerance([], 0.75, 1.5, 1.5, scaled_margin=0.97) == (0.0, 0.97)
    assert stop_tolerance([], 0.75, 1.5, 1.5, scaled_margin=9.0) == (0.0, 1.5)


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


def test_a_large_eos_row_widens_the_margin_by_its_logit_noise():
    """qwen3-0.6b-random's EOS row makes an EOS-vs-top-1 gap 3.24x as noisy as an ordinary near-tie: 0.3 x 3.24 =
    0.97 nats, so the exact engines' 0.88-nat stops pass there, and a stop 1.2 below does not."""
    check = _stops(ref_gap=0.0, cand_gap=0.88, eos_scale=3.24)
    assert check.passed, check.detail
    assert check.extra["stop_margin"] == pytest.approx(0.972) and check.extra["eos_scale"] == 3.24
    assert "3.24x" in check.detail
    assert not _stops(ref_gap=0.0, cand_gap=1.2, eos_scale=3.24).passed
    assert _stops(ref_gap=0.0, cand_gap=1.6, eos_scale=50.0).extra["stop_margin"] == GateThresholds().stop_cap


def _write_model(path, rows: dict[str, "torch.Tensor"]):
    from safetensors.torch import save_file
    path.mkdir()
    save_file(rows, str(path / "model.safetensors"))
    return path


def test_eos_gap_scale_reads_the_output_rows(tmp_path):
    import torch
    w = torch.zeros(64, 8)
    w[:, 0] = 4.0                  # every row norm 4
    w[7, 0] = 12.0                 # EOS 7: three times the median
    scale = eos_gap_scale(_write_model(tmp_path / "untied", {"lm_head.weight": w,
                                                            "model.embed_tokens.weight": torch.ones(64, 8)}), [7, 3])
    assert scale == pytest.approx((12 ** 2 + 4 ** 2) ** 0.5 / (2 ** 0.5 * 4))
    # tied weights: only the input embedding is stored; an ordinary EOS row gives no widening
    tied = _write_model(tmp_path / "tied", {"model.embed_tokens.weight": w.to(torch.bfloat16)})
    assert eos_gap_scale(tied, [3]) == 1.0
    assert eos_gap_scale(tied, [7]) == pytest.approx(scale)


def test_eos_gap_scale_rejects_what_it_cannot_read(tmp_path):
    import torch
    model = _write_model(tmp_path / "m", {"model.layers.0.mlp.weight": torch.ones(4, 4)})
    with pytest.raises(GateInputError, match="no output matrix"):
        eos_gap_scale(model, [1])
    model = _write_model(tmp_path / "n", {"lm_head.weight": torch.ones(4, 4)})
    with pytest.raises(GateInputError, match="outside the output matrix"):
        eos_gap_scale(model, [4])


def _outs(lengths: list[int]) -> list[GenerationOut]:
    return [GenerationOut(token_ids=[5] * (n - 1) + [EOS], finish_reason="stop") for n in lengths]


def test_early_ends_is_a_one_sided_sign_test_over_requests_whose_lengths_differ():
    ref = _outs([4, 4, 4, 4, 4])
    assert early_ends(ref, _outs([4, 4, 4, 4, 4]), [True] * 5) == EarlyEnds(0, 0, 1.0)
    assert early_ends(ref, _outs([2, 6, 4, 4, 4]), [True] * 5).p == 0.75  # P(X >= 1 | n = 2)
    assert early_ends(ref, _outs([2, 2, 2, 2, 6]), [True] * 5).p == 6 / 32  # P(X >= 4 | n = 5)
    assert early_ends(ref, _outs([2] * 5), [True] * 5).p == 1 / 32
    # fixed-length requests and missing replies do not count
    assert early_ends(ref, [None, *_outs([2, 2, 2, 2])], [True, True, True, False, False]) == EarlyEnds(2, 0, 0.25)


def test_a_candidate_that_stops_at_every_near_tie_fails_the_timed_path():
    """Every stop 0.5 nats below the reference's top-1 (within the stop margin) and every text a near-tie away:
    only the direction gives it away. Ending early on 8 of 8 requests fails; 5 early and 3 late passes."""
    sampling = Sampling(max_new_tokens=8, ignore_eos=False, stop_token_ids=())
    prompts = tuple((1, i) for i in range(8))
    sets = [PromptSet("dev-natural", tuple(map(str, range(8))), prompts, (sampling,) * 8)]
    cal = Calibration(method="test", noise={}, tolerance={"top1": 0.5, "length": 0.1}, positions=1, requests=1)

    def early_ends_check(cand_lengths: list[int]):
        outputs = {"candidate": [_outs(cand_lengths)], "vanilla": [_outs([4] * 8)]}
        timed = TimedOutputs(sets={"dev-natural": sets}, outputs={"dev-natural": outputs})
        checks = timed_checks(ScriptedReference({}), timed, cal, GateThresholds(), [EOS], VOCAB, 64)
        assert all(c.passed for c in checks if c.name != "timed.dev-natural.early_ends")
        return next(c for c in checks if c.name == "timed.dev-natural.early_ends")

    one_way = early_ends_check([2] * 8)
    assert not one_way.passed and one_way.value == 1 / 256 and "on 8 and after it on 0" in one_way.detail
    assert early_ends_check([2] * 5 + [6] * 3).passed


class EosAheadReference(ScriptedReference):
    """Scores every token as its own top-1, except at output position `at`, where an EOS leads it by `gap` nats."""

    def __init__(self, at: int, gap: float):
        super().__init__({})
        self.at, self.gap = at, gap

    def score(self, prompts, continuations, top_k):
        out = []
        for cont in continuations:
            s = super().score([None], [cont], top_k)[0]
            if len(cont) > self.at and cont[self.at] != EOS:
                s.top_ids[self.at][0] = EOS
                s.token_logprobs[self.at] = -1.0 - self.gap
            out.append(s)
        return out


def _missed(gap: float, ignore_eos: bool = False, eos_scale: float = 1.0):
    """A candidate that went on at position 1 (the reference's [5, 6, EOS] is its own, [5, 7, 8, 9, EOS] ran on)."""
    timed = _timed()
    sampling = Sampling(max_new_tokens=8, ignore_eos=ignore_eos, stop_token_ids=())
    timed.sets["dev-natural"] = [PromptSet("dev-natural", ("p",), (PROMPT,), (sampling,)) for _ in range(3)]
    long = [5, 7, 8, 9] if ignore_eos else [5, 7, 8, 9, EOS]
    timed.outputs["dev-natural"]["candidate"] = [[GenerationOut(token_ids=long, finish_reason="length" if ignore_eos
                                                                else "stop")] for _ in range(3)]
    cal = Calibration(method="test", noise={}, tolerance={"top1": 0.5, "length": 0.5}, positions=1, requests=1)
    checks = timed_checks(EosAheadReference(1, gap), timed, cal, GateThresholds(), [EOS], VOCAB, 64, eos_scale)
    return {c.name: c for c in checks}


def test_a_candidate_that_runs_past_a_clear_eos_fails_the_timed_path_whatever_its_rate():
    """One token in five goes on where the reference's EOS leads by 2 nats: greedy_valid (a rate, tolerance 0.5 here)
    lets it through, the missed-stops rule names every request; lengths cannot show it (the texts differ there)."""
    checks = _missed(gap=2.0)
    assert checks["timed.dev-natural.greedy_valid"].passed
    assert checks["timed.dev-natural.natural_length"].passed and checks["timed.dev-natural.early_ends"].passed
    missed = checks["timed.dev-natural.missed_stops"]
    assert not missed.passed and missed.value == 3.0
    assert "token 1 went on past an EOS/stop id the reference puts 2.00 nats above it" in missed.detail


def test_going_on_past_an_eos_near_tie_or_where_eos_is_ignored_is_no_missed_stop():
    """Within the stop margin (0.75 nats, wider with a large EOS row) an honest engine's rounding may go on; with
    ignore_eos nothing is missed."""
    assert checks_pass(_missed(gap=0.5))
    assert checks_pass(_missed(gap=0.9, eos_scale=3.24))
    assert not _missed(gap=1.2, eos_scale=3.24)["timed.dev-natural.missed_stops"].passed
    assert _missed(gap=5.0, ignore_eos=True)["timed.dev-natural.missed_stops"].passed


def checks_pass(checks) -> bool:
    return checks["timed.dev-natural.missed_stops"].passed


def test_the_gates_host_side_reads_the_model_without_torch():
    """The tokenizer, a chat prompt and the EOS scale, as the gate's host process gets them, in a fresh interpreter:
    no torch (a session process that imports it pays about 2 s of CPU for nothing)."""
    code = ("import sys\n"
            "from seis.evaluator.logit_scale import eos_gap_scale\n"
            "from seis.models import resolve_model\n"
            "from seis.prompts import encode_prompt, load_tokenizer\n"
            "model = resolve_model('tiny-qwen3')\n"
            "tok = load_tokenizer(model)\n"
            "assert encode_prompt(tok, 'What is 2+3?', chat=True)[-1] != tok.eos_token_id\n"
            "assert eos_gap_scale(model, [tok.eos_token_id]) >= 1.0\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
