"""The gate's contract checks beyond greedy numerics, on CPU with tiny-qwen3: sampling semantics (sampling.support,
sampling.tv), stop_token_ids (stop_ids), exact max_new_tokens under ignore_eos, long contexts and late decode
positions. E0 passes them all; candidates that break one contract rule each fail its named check; the sampling
math is checked as pure functions (and against E0's own sampler)."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from seis.engine_import import ENGINE_TEMPLATE
from seis.evaluator import GateResult, run_gate
from seis.evaluator.calibration import sampling_tolerances
from seis.evaluator.checks import (
    empirical_tv,
    expected_tv,
    greedy_tv,
    late_stop_positions,
    length_problems,
    stop_position,
    stop_problems,
    support_problems,
    target_distribution,
    sequence_fit,
    small_sample_slack,
    temperature_for,
    tolerated_tokens,
    top_probability,
    well_conditioned_top_p,
)
from seis.evaluator.engines import GenerationOut
from seis.evaluator.gate_config import CheckSizes, GateThresholds, SpeedConfig
from seis.evaluator.workloads import load_gate_workloads, read_model_limits
from seis.models import resolve_model
from seis.prompts import load_tokenizer

import evaluator_helpers as H

NEW_CHECKS = {"sampling.support", "sampling.tv", "sampling.sequence_support", "sampling.sequence", "sampling.seeded",
              "stop_ids"}
SPLITS = ("long_context", "late")


def edit(root: Path, rel: str, old: str, new: str) -> Path:
    """The helpers' pattern: the replaced text must occur exactly once, so a template change fails loudly."""
    H.edit(root, rel, old, new)
    return root


# --- candidates that each break one contract rule ------------------------------------------------------------------
def always_greedy(root: Path) -> Path:  # ignores temperature
    return edit(root, H.ENGINE_PY, "            if r.forced is None and not r.params.greedy:\n",
                "            if False:\n")


def ignore_top_p(root: Path) -> Path:
    return edit(root, "engine/sampling.py", "    if params.top_p < 1.0:\n", "    if False:\n")


def ignore_top_k(root: Path) -> Path:
    return edit(root, "engine/sampling.py", "    if params.top_k > 0:\n", "    if False:\n")


def ignore_stop_ids(root: Path) -> Path:
    return edit(root, H.ENGINE_PY, "        stop = frozenset(params.stop_token_ids) | (",
                "        stop = frozenset() | (")


def stop_ids_only_early(root: Path) -> Path:
    """stop_token_ids honoured only in the first 16 output tokens (as an engine checking them in its first decode
    chunk only would); EOS always. Stops at positions 2..8 end right, later ones are run past."""
    return edit(root, "engine/request.py", "        elif token in self.stop_ids:\n",
                "        elif token in self.stop_ids and (len(self.output) <= 16\n"
                "                                         or token not in self.params.stop_token_ids):\n")


def stop_ids_only_early_diverging(root: Path) -> Path:
    """stop_ids_only_early in an engine whose long greedy outputs leave the reference's at token 14 (the runner-up
    taken there, as bf16 rounding at a near-tie does): one token in the late split's 300, within every rate, and the
    reference's late stops are never reached, so only the stops in its own late output can show the bug."""
    stop_ids_only_early(root)
    return edit(root, H.ENGINE_PY, "                chosen[i] = sample(logits[i], r.params, r.generator)\n",
                "                chosen[i] = sample(logits[i], r.params, r.generator)\n"
                "            elif r.forced is None and r.params.max_new_tokens > 20 and len(r.output) == 14:\n"
                "                chosen[i] = logits[i].topk(2).indices[1]\n")


def eos_despite_ignore_eos(root: Path) -> Path:  # stops at an EOS even when told to ignore it
    return edit(root, H.ENGINE_PY,
                "        stop = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else "
                "frozenset(self.eos_token_ids))",
                "        stop = frozenset(params.stop_token_ids) | frozenset(self.eos_token_ids)")


def sample_first_token_only(root: Path) -> Path:  # the first token (prefill) sampled, every later one greedy
    return edit(root, H.ENGINE_PY, "            if r.forced is None and not r.params.greedy:\n",
                "            if r.forced is None and not r.params.greedy and not r.output:\n")


def sampled_decode_skips_layers(root: Path) -> Path:
    """Decode steps of sampled requests (no forced tokens, temperature > 0) run every other layer: a lossy fast path
    where, the outputs being random anyway, no exact comparison could show it. Prefill is exact."""
    edit(root, H.MODEL_PY, "        for layer in self.layers:\n",
         "        for layer in (self.layers[::2] if batch.is_decode and getattr(self, '_sampled', False)\n"
         "                      else self.layers):\n")
    return edit(root, H.ENGINE_PY, '        self._counters["decode_steps"] += 1\n',
                '        self._counters["decode_steps"] += 1\n'
                '        self.model._sampled = all(r.forced is None and not r.params.greedy for r in running)\n')


SEEDED_GENERATOR = ("            generator = torch.Generator(device=self.device)\n"
                    "            generator.manual_seed(params.seed if params.seed is not None else "
                    "self.options.seed + index)\n")


def one_generator_per_engine(root: Path) -> Path:
    """Every sampled request draws from one generator seeded at build (as a batched sampler with one random stream
    does): exact distributions, but a request's tokens depend on what was sampled before it, not on its seed."""
    return edit(root, H.ENGINE_PY, SEEDED_GENERATOR,
                "            if not hasattr(self, '_shared_generator'):\n"
                "                self._shared_generator = torch.Generator(device=self.device)\n"
                "                self._shared_generator.manual_seed(self.options.seed)\n"
                "            generator = self._shared_generator\n")


def seeds_by_batch_position(root: Path) -> Path:  # the request's seed ignored: its position in the batch seeds it
    return edit(root, H.ENGINE_PY, SEEDED_GENERATOR,
                "            generator = torch.Generator(device=self.device)\n"
                "            generator.manual_seed(self.options.seed + index)\n")


def rope_clamped_at_256(root: Path) -> Path:  # right on short prompts, wrong from position 256 on
    return edit(root, H.MODEL_PY, "        q, k = ops.rope(batch.positions, q, k, cos_sin)\n",
                "        q, k = ops.rope(batch.positions.clamp(max=255), q, k, cos_sin)\n")


def _check(result: GateResult, name: str):
    return next(c for c in result.checks if c.name == name)


@pytest.fixture(scope="module")
def e0_gate(prepared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GateResult:
    candidate = H.copy_engine(tmp_path_factory.mktemp("contract") / "candidate")
    return run_gate(H.tiny_config(prepared_dir, candidate))


@pytest.mark.slow
def test_e0_copy_passes_the_contract_checks(e0_gate: GateResult) -> None:
    assert e0_gate.verdict == "pass", e0_gate.failed_checks
    names = {c.name for c in e0_gate.checks}
    assert NEW_CHECKS <= names
    for split in SPLITS:
        for path in ("decode", "verify"):
            assert {f"{split}.{path}.kl", f"{split}.{path}.top1", f"{split}.{path}.ppl_ratio"} <= names
        assert {f"{split}.answered", f"{split}.lengths", f"{split}.greedy_valid"} <= names
    assert not {"long_context.greedy_exact", "late.greedy_exact"} & names  # a handful of requests: greedy_valid
    assert not any(c.skipped for c in e0_gate.checks if c.name in NEW_CHECKS or c.name.startswith(SPLITS))
    counts = e0_gate.counts
    # tiny-qwen3 has 512 positions: long prompts use what fits (>= 256), the late request passes position 256
    assert counts["long_context_prompts"] == 2 and counts["long_context_prompt_tokens"] == 512 - 64
    assert counts["late_forced_positions"] == 300 and counts["sampling_requests"] == 2 * 2 * 128
    # 4 stops at positions 2..8, and 3 late ones in the late split's output (past 16, past 64, its last new token)
    assert counts["stop_requests"] == 4 + 3 and counts["sampled_sequences"] == 2 * 2 * 8
    seq = _check(e0_gate, "sampling.sequence")
    # CPU fp32, same seeds: the copy samples the reference's very sequences
    assert seq.value == pytest.approx(seq.extra["reference_deviation"], abs=1e-12)
    assert seq.extra["tokens"] == 2 * 2 * 8 * H.TINY_CHECKS.max_new_tokens and seq.upper < 0.4
    seeded = _check(e0_gate, "sampling.seeded")
    assert seeded.value == 1.0 and e0_gate.calibration.noise["sampling_seeded_mismatch"] == 0.0
    assert e0_gate.calibration.tolerance["sampling_seeded"] == GateThresholds().seeded_floor
    stop = _check(e0_gate, "stop_ids")
    assert "7 ended exactly at the reference's stop position" in stop.detail
    assert stop.extra["late_requests"] == stop.extra["late_reached"] == 3 and "at output positions 16, 64, " in stop.detail
    tv = _check(e0_gate, "sampling.tv")
    # CPU fp32, same seeds: the copy samples exactly what the reference sampled
    assert tv.value == pytest.approx(tv.extra["reference_tv"], abs=1e-12)
    assert tv.value < tv.upper < tv.extra["greedy_tv"] / 2  # an always-greedy engine would be far outside
    cal = e0_gate.calibration
    assert cal.tolerance["sampling_margin"] == GateThresholds().sampling_margin_floor
    assert cal.noise["sampling_shift_tv"] < 1e-6 and cal.noise["sampling_logprob_noise"] < 1e-4
    assert cal.noise["sampling_kl_logit_scale"] < 1e-4
    assert cal.tolerance["late.kl"] == GateThresholds().kl_floor


# Each breaker's gate runs only the new checks it is about (the others are independent and the E0 gate above runs
# them all), which keeps these CPU gates short.
ONLY_SAMPLING = H.TINY_CHECKS.model_copy(update={"n_stop": 0, "n_long": 0, "late_tokens": 0})
ONLY_STOP = H.TINY_CHECKS.model_copy(update={"n_sampling_prompts": 0, "n_long": 0})  # the late split: late stops
ONLY_POSITIONS = H.TINY_CHECKS.model_copy(update={"n_sampling_prompts": 0, "n_stop": 0})


@pytest.mark.parametrize("breaker, checks, check", [
    pytest.param(always_greedy, ONLY_SAMPLING, "sampling.tv", id="always_greedy"),
    pytest.param(ignore_top_p, ONLY_SAMPLING, "sampling.support", id="ignore_top_p"),
    pytest.param(ignore_top_k, ONLY_SAMPLING, "sampling.support", id="ignore_top_k"),
    pytest.param(ignore_stop_ids, ONLY_STOP, "stop_ids", id="ignore_stop_ids"),
    pytest.param(stop_ids_only_early, ONLY_STOP, "stop_ids", id="stop_ids_only_early"),
    pytest.param(stop_ids_only_early_diverging, ONLY_STOP, "stop_ids", id="stop_ids_only_early_diverging"),
    pytest.param(eos_despite_ignore_eos, ONLY_SAMPLING, "sampling.support", id="eos_despite_ignore_eos"),
    pytest.param(rope_clamped_at_256, ONLY_POSITIONS, "late.decode.kl", id="rope_clamped_at_256"),
    pytest.param(sample_first_token_only, ONLY_SAMPLING, "sampling.sequence", id="sample_first_token_only"),
    pytest.param(sampled_decode_skips_layers, ONLY_SAMPLING, "sampling.sequence",
                 id="sampled_decode_skips_layers"),
    pytest.param(one_generator_per_engine, ONLY_SAMPLING, "sampling.seeded", id="one_generator_per_engine"),
    pytest.param(seeds_by_batch_position, ONLY_SAMPLING, "sampling.seeded", id="seeds_by_batch_position"),
])
@pytest.mark.slow
def test_contract_breaker_fails_its_check(breaker, checks, check: str, prepared_dir: Path, tmp_path: Path) -> None:
    result = run_gate(H.tiny_config(prepared_dir, breaker(H.copy_engine(tmp_path / "cand")), checks=checks))
    assert result.verdict == "fail"
    assert check in result.failed_checks, result.failed_checks
    failed = _check(result, check)
    assert failed.detail
    if breaker is always_greedy:
        assert failed.value > 2 * failed.upper  # clearly, not a borderline call
        assert "sampling.support" not in result.failed_checks  # the top token is always allowed
    if breaker is ignore_top_p:
        assert failed.value >= 2 and "outside the" in failed.detail
        assert "top_p=0." in failed.detail and "top_p=1:" not in failed.detail  # only the nucleus settings
    if breaker is ignore_stop_ids:
        assert "did not end there" in failed.detail
    if breaker is stop_ids_only_early:
        # every early stop ends right; the three late ones (positions 16, 64 and later) are run past, and the same
        # three in its own late output (fp32 on the CPU: its text is the reference's)
        assert result.failed_checks == ["stop_ids"] and failed.value == 6
        assert "did not end there" in failed.detail and "at token 64 but" in failed.detail
    if breaker is stop_ids_only_early_diverging:
        # the reference's late stops are never reached; its own three are, and run past
        assert result.failed_checks == ["stop_ids"]
        assert failed.detail.count("on its own late output") == failed.value == 3, failed.detail
    if breaker is eos_despite_ignore_eos:  # a sampled EOS ended one-token ignore_eos requests with "stop"
        assert "expected exactly 1 with finish 'length'" in failed.detail
    if breaker in (sample_first_token_only, sampled_decode_skips_layers):
        # one-token requests never reach a decode step: only the multi-token ones show it
        assert not {"sampling.tv", "sampling.support"} & set(result.failed_checks)
        assert abs(failed.value) > 1.5 * failed.upper
        if breaker is sample_first_token_only:  # greedy tokens: likelier than samples, and always allowed
            assert failed.value > 0 and "sampling.sequence_support" not in result.failed_checks
        else:  # a lossy model: less likely than samples, some outside the top-k
            assert failed.value < 0 and "sampling.sequence_support" in result.failed_checks
    if breaker in (one_generator_per_engine, seeds_by_batch_position):
        # right distributions, so only the seeds give it away: few requests repeat their tokens in another order
        assert result.failed_checks == ["sampling.seeded"]
        assert failed.value < 0.25
    if breaker is rope_clamped_at_256:
        assert {"late.verify.kl", "long_context.decode.kl", "long_context.verify.kl"} <= set(result.failed_checks)
        assert not [n for n in result.failed_checks if n.startswith(("dev.", "heldout."))]  # short prompts: fine
    # greedy numerics are untouched by the sampling and stop-id breakers
    if breaker in (always_greedy, ignore_top_p, ignore_top_k, ignore_stop_ids, stop_ids_only_early,
                   stop_ids_only_early_diverging, sample_first_token_only,
                   sampled_decode_skips_layers, one_generator_per_engine, seeds_by_batch_position):
        assert not [n for n in result.failed_checks if n.endswith((".kl", ".top1", ".greedy_valid"))]


# --- workloads ----------------------------------------------------------------------------------------------------
def test_long_context_workloads_fit_the_model(prepared_dir: Path) -> None:
    model_dir = resolve_model("tiny-qwen3")
    vocab, max_positions = read_model_limits(model_dir)
    cfg = H.tiny_config(prepared_dir, ENGINE_TEMPLATE)
    wl = load_gate_workloads(cfg, model_dir)
    assert wl.budget.max_seq_len == max_positions == 512  # raised from the short checks' needs to fit them
    assert wl.budget.check_prompt_cap == cfg.max_prompt_tokens  # the existing splits are unchanged
    assert len(wl.long) == 2 and len(set(wl.long.prompts)) == 2
    for prompt, sp in zip(wl.long.prompts, wl.long.sampling):
        assert len(prompt) == 512 - sp.max_new_tokens and all(0 <= t < vocab for t in prompt)
        assert sp.ignore_eos and sp.temperature == 0
    assert "capped from 1536" in wl.long_note
    assert wl.late.prompts == wl.dev.prompts[:1] and wl.late.sampling[0].max_new_tokens == 300
    assert load_gate_workloads(cfg, model_dir).digest() == wl.digest()  # deterministic
    small = cfg.model_copy(update={"checks": TINY_NO_LONG})
    short = load_gate_workloads(small, model_dir)
    assert len(short.long) == 0 and "fewer than long_min_tokens" in short.long_note


TINY_NO_LONG = H.TINY_CHECKS.model_copy(update={"long_min_tokens": 500})


def test_checked_and_timed_prompts_carry_the_same_kind_of_tag_and_no_nonce(prepared_dir: Path) -> None:
    """A tag that only timed prompts had let an engine run a lossy fast path on exactly the prompts the lenient
    timed checks judge. Every GSM8K prompt of the gate, checked (dev, held-out) or timed (warm-up included), has
    one tag of its own, before and after the question (after it only, where the prompt's start was cut to fit);
    the nonce it comes from is in none."""
    import re
    model_dir = resolve_model("tiny-qwen3")
    tok = load_tokenizer(model_dir)
    speed = SpeedConfig(n_prompts=2, natural_max_new_tokens=8, fixed_max_new_tokens=8)
    wl = load_gate_workloads(H.tiny_config(prepared_dir, ENGINE_TEMPLATE, max_prompt_tokens=480, speed=speed,
                                           prompt_nonce="0123abcd"), model_dir)
    checked = [p for label, p in zip(wl.dev.labels + wl.heldout.labels, wl.dev.prompts + wl.heldout.prompts)
               if label.startswith("gsm8k-")]
    timed = [p for w in wl.speed for s in (w.warmup, *w.passes) for p in s.prompts]
    assert len(checked) == 5 and len(timed) >= 8
    tags = [re.findall(r"\(request ([0-9a-f]{16})\)", tok.decode(list(p))) for p in checked + timed]
    assert all(len(t) in (1, 2) and len(set(t)) == 1 for t in tags)  # one where the prompt's start was cut
    assert sum(len(t) == 2 for t in tags) >= 3 and len({t[-1] for t in tags}) == len(tags)
    assert not any("0123abcd" in tok.decode(list(p)) for p in checked + timed)


def test_a_timed_prompt_shares_no_more_with_the_public_question_than_with_any_other(prepared_dir: Path) -> None:
    """An engine may know the public dev questions, not the gate's nonce. Whatever it could compute ahead of a
    timed request (the KV of a known prefix, say) must then be no longer than what every request shares anyway
    (the fixed instruction): the same question under another nonce parts inside its request tag. Prompts
    cut to fit the context keep their end, so only whole ones make that promise; every prompt stays unknowable."""
    model_dir = resolve_model("tiny-qwen3")

    def timed(nonce: str) -> tuple[list[tuple[int, ...]], int]:
        speed = SpeedConfig(n_prompts=2, natural_max_new_tokens=8, fixed_max_new_tokens=8)
        wl = load_gate_workloads(H.tiny_config(prepared_dir, ENGINE_TEMPLATE, max_prompt_tokens=480, speed=speed,
                                               prompt_nonce=nonce), model_dir)
        return [p for w in wl.speed for s in (w.warmup, *w.passes) for p in s.prompts], wl.budget.speed_prompt_cap

    def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    (first, cap), (second, _) = timed("0123abcd"), timed("fedc9876")
    assert len(first) == len(second) >= 8 and len(set(first)) == len(first)
    whole = [(a, b) for a, b in zip(first, second, strict=True) if len(a) < cap]
    assert len(whole) >= 3
    tok = load_tokenizer(model_dir)
    for a, b in whole:  # the same question under two nonces parts inside its first tag, before the question
        before, _, tag = tok.decode(list(a[:common(a, b)])).partition("(request ")
        assert "Question:" in before and "(request" not in before and ")" not in tag
    assert all(a != b for a, b in zip(first, second))



# --- pure pieces: the target distribution, TV, support, stop ids ----------------------------------------------------
LPS = [math.log(p) for p in (0.4, 0.2, 0.15, 0.1, 0.08, 0.04, 0.02, 0.01)]
IDS = [10, 11, 12, 13, 14, 15, 16, 17]


def test_target_distribution_is_top_k_then_nucleus() -> None:
    q = target_distribution(IDS, LPS, 1.0, 4, 1.0)
    z = 0.4 + 0.2 + 0.15 + 0.1
    assert q == pytest.approx({10: 0.4 / z, 11: 0.2 / z, 12: 0.15 / z, 13: 0.1 / z})
    # nucleus over the top-k-renormalised mass: the smallest prefix reaching top_p (0.47, 0.71 >= 0.6)
    q = target_distribution(IDS, LPS, 1.0, 4, 0.6)
    assert q == pytest.approx({10: 0.4 / 0.6, 11: 0.2 / 0.6})
    assert target_distribution(IDS, LPS, 1.0, 4, 0.3) == {10: 1.0}  # the first token always stays
    # temperature before the cut: T=2 flattens (probabilities ~ p^(1/2))
    q = target_distribution(IDS, LPS, 2.0, 8, 1.0)
    w = [math.sqrt(math.exp(lp)) for lp in LPS]
    assert q[10] == pytest.approx(w[0] / sum(w))
    # ties with the k-th are kept (as E0's `logits < kth` mask does)
    tied = target_distribution([1, 2, 3, 4], [-1.0, -2.0, -2.0, -3.0], 1.0, 2, 1.0)
    assert set(tied) == {1, 2, 3}
    assert sum(target_distribution(IDS[::-1], LPS[::-1], 0.7, 5, 0.8).values()) == pytest.approx(1.0)


def test_target_distribution_matches_e0_sampler(E, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact probabilities E0's sample() draws from, for a full-vocabulary row of logits."""
    import sys
    sampling = sys.modules[E.__name__ + ".sampling"]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, generator=g) * 3
    lps = torch.log_softmax(logits, -1)
    top = lps.topk(64)
    seen = {}

    def fake_multinomial(probs, n, generator=None):
        seen["probs"] = probs.clone()
        return torch.zeros(1, dtype=torch.long)

    monkeypatch.setattr(torch, "multinomial", fake_multinomial)
    for temp, k, p in ((0.7, 40, 1.0), (1.3, 40, 0.6), (2.5, 10, 0.9)):
        sampling.sample(logits, E.SamplingParams(max_new_tokens=1, temperature=temp, top_k=k, top_p=p), None)
        q = target_distribution(top.indices.tolist(), top.values.tolist(), temp, k, p)
        probs = seen["probs"] / seen["probs"].sum()  # multinomial normalises; E0 leaves the nucleus unscaled
        assert set(torch.nonzero(probs).flatten().tolist()) == set(q)
        for t, v in q.items():
            assert probs[t].item() == pytest.approx(v, rel=1e-4)


def test_temperature_bisection_hits_the_target_top_probability() -> None:
    for target in (0.3, 0.5, 0.9):
        t = temperature_for(LPS, 6, target)
        assert top_probability(LPS, t, 6) == pytest.approx(target, abs=1e-6)
    assert temperature_for([0.0, 0.0, 0.0, 0.0], 4, 0.3) == 1e-3  # a 4-way tie never reaches 0.3: clamped
    assert temperature_for([0.0, -50.0], 2, 0.3) == 1e3             # too peaked to flatten: clamped


def test_nucleus_boundary_is_kept_off_ties() -> None:
    # two tokens tied at the top with 0.3 each: a nominal top_p of 0.6 sits exactly on their cumulative mass
    lps = [math.log(p) for p in (0.3, 0.3, 0.15, 0.12, 0.08, 0.05)]
    top_p = well_conditioned_top_p(lps, 1.0, 6, 0.6)
    # the middle of the interval (0.3, 0.6] that keeps exactly the two tied tokens (0.3 | 0.15 is log 2 apart;
    # keeping three would put the boundary between 0.15 and 0.12, only 0.22 nats apart)
    assert top_p == pytest.approx(0.45)
    assert set(target_distribution(list(range(6)), lps, 1.0, 6, top_p)) == {0, 1}
    # a boundary between near-tied tokens is avoided when a well-separated one is near
    near = [math.log(p) for p in (0.3, 0.2, 0.2, 0.1, 0.1, 0.1)]
    top_p = well_conditioned_top_p(near, 1.0, 6, 0.6)
    kept = target_distribution(list(range(6)), near, 1.0, 6, top_p)
    assert len(kept) == 3 and 0.5 < top_p < 0.7  # 0.2 | 0.1: log(2) apart; not 0.2 | 0.2 nor 0.1 | 0.1
    assert well_conditioned_top_p(LPS, 1.0, 4, 0.6) == pytest.approx(0.4 / 0.85 + 0.1 / 0.85)


def test_expected_tv_is_exact_and_matches_simulation() -> None:
    assert expected_tv([0.5, 0.5], 2) == pytest.approx(0.25)       # X ~ Bin(2, 1/2): |X/2 - 1/2| = 1/2 half the time
    assert expected_tv([1.0], 64) == 0.0
    q = {10 + i: p for i, p in enumerate([0.3, 0.2, 0.1] + [0.4 / 16] * 16)}
    exact = expected_tv(list(q.values()), 64)
    rng = random.Random(0)
    sims = [empirical_tv(rng.choices(list(q), list(q.values()), k=64), q) for _ in range(4000)]
    assert sum(sims) / len(sims) == pytest.approx(exact, rel=0.03)
    assert expected_tv(list(q.values()), 256) < exact / 1.8  # ~ 1/sqrt(n)


def test_empirical_tv_and_greedy_tv() -> None:
    q = {1: 0.5, 2: 0.5}
    assert empirical_tv([1, 2, 1, 2], q) == 0.0
    assert empirical_tv([1, 1, 2, None], q) == pytest.approx(0.25)  # a missing sample is mass outside q
    assert empirical_tv([3, 3], q) == pytest.approx(1.0)
    assert empirical_tv([1] * 10, q) == pytest.approx(greedy_tv(q)) == 0.5
    th = GateThresholds()
    tol = sampling_tolerances(th, expected_tv=0.1, ref_tv=0.12, shift_tv=0.0, logprob_noise=0.0)
    assert tol["sampling_tv"] == pytest.approx(0.18) and tol["sampling_margin"] == th.sampling_margin_floor
    assert sampling_tolerances(th, 0.1, 0.1, 0.0, 0.054)["sampling_margin"] == pytest.approx(0.108)
    assert sampling_tolerances(th, 0.1, 0.1, 0.0, 0.001)["sampling_margin"] == th.sampling_margin_floor
    assert sampling_tolerances(th, 0.1, 0.05, 0.02, 1.0) == {"sampling_tv": pytest.approx(0.21),
                                                             "sampling_margin": th.sampling_margin_cap}
    assert sampling_tolerances(th, 0.5, 0.5, 0.0, 0.0)["sampling_tv"] == th.tv_cap


def test_sequence_fit_is_centred_for_exact_samples_and_not_for_greedy_or_other_models() -> None:
    """log q(x) + H(q) has mean 0 under exact sampling: exact samples stay within a few standard errors, greedy
    tokens sit far above, samples of a flatter distribution far below."""
    rng = random.Random(7)
    targets = []
    for _ in range(400):
        w = [math.exp(rng.gauss(0.0, 1.5)) for _ in range(20)]
        targets.append({t: x / sum(w) for t, x in enumerate(w)})

    def draw(q: dict[int, float]) -> int:
        return rng.choices(list(q), weights=list(q.values()))[0]
    exact = sequence_fit(targets, [draw(q) for q in targets])
    assert exact.tokens == 400 and abs(exact.deviation) < 4 * exact.stderr and 0 < exact.stderr < 0.1
    greedy = sequence_fit(targets, [max(q, key=q.get) for q in targets])
    assert greedy.deviation > 10 * greedy.stderr
    flat = sequence_fit(targets, [rng.randrange(20) for _ in targets])
    assert flat.deviation < -10 * flat.stderr
    outside = sequence_fit(targets[:2], [99, draw(targets[1])])  # outside the support: left to the support check
    assert outside.tokens == 1
    assert sequence_fit(targets[:1], [99]).tokens == 0 and math.isnan(sequence_fit([], []).deviation)


def test_support_flags_tokens_outside_top_k_and_top_p() -> None:
    # top_k=4, top_p=0.6 -> allowed {10, 11}; 12 is outside (above it: 0.71 of the mass)
    ok, n = support_problems([10, 11, 10], IDS, LPS, 1.0, 4, 0.6, 0.02, "s")
    assert ok == [] and n == 0
    bad, n = support_problems([10, 12, 12, 14, 99, None], IDS, LPS, 1.0, 4, 0.6, 0.02, "s")
    assert n == 5 and len(bad) == 4
    assert "token 12 sampled 2x" in bad[0] and any("not in the reference's top 8" in b for b in bad)
    assert any("gave no token" in b for b in bad)
    # without top_p, 12 and 13 are inside; 14 is outside the top-4
    assert support_problems([12, 13], IDS, LPS, 1.0, 4, 1.0, 0.02, "s") == ([], 0)
    assert support_problems([14], IDS, LPS, 1.0, 4, 1.0, 0.02, "s")[1] == 1
    # near-ties at the cut are tolerated: 14 is 0.001 nats below the 4th token, well within noise of 0.02
    near = [math.log(p) for p in (0.4, 0.2, 0.15, 0.1, 0.0999, 0.04)]
    assert support_problems([14], IDS[:6], near, 1.0, 4, 1.0, 0.02, "s") == ([], 0)
    assert support_problems([15], IDS[:6], near, 1.0, 4, 1.0, 0.02, "s")[1] == 1  # 0.92 nats below: no
    # a nucleus boundary shift: at top_p=0.46 only 10 is allowed and 11 is just outside (0.47 of the mass above
    # it): noise of 0.1 nats can move that boundary, noise of 0.001 cannot
    assert support_problems([11], IDS, LPS, 1.0, 4, 0.46, 0.1, "s")[1] == 0
    assert support_problems([11], IDS, LPS, 1.0, 4, 0.46, 0.001, "s")[1] == 1
    # ... but not so far that the whole top-k becomes the nucleus (an engine ignoring top_p stays visible)
    assert tolerated_tokens(IDS, LPS, 1.0, 4, 0.6, 0.1) == {10, 11, 12}
    assert tolerated_tokens(IDS, LPS, 1.0, 4, 0.6, 0.0) == {10, 11}


def test_stop_position_and_stop_rules() -> None:
    eos = [0]
    assert stop_position([5, 5, 7, 8, 9], eos) == 2
    assert stop_position([5, 6, 5, 6, 5, 9, 1], eos) == 5   # 5 and 6 repeat; 9 is new at 5
    assert stop_position([5, 6, 0, 8, 9], eos) == 3         # never an EOS
    assert stop_position([5, 6, 7], eos) is None            # the stop token must not be the last one
    exp, stops, n = [[5, 6, 7]], [(7,)], [7]
    # late stops: the first new token past each start, and the output's last new one (never EOS, never the last)
    late = [1, 2, 3] * 10 + [40] + [1] * 40 + [71, 0, 72] + [2] * 30 + [99, 100]
    assert late_stop_positions(late, eos) == [30, 71, 104]   # 72 (EOS 0) skipped, 105 is the last token
    assert late_stop_positions(late, eos, starts=(16, 64, 80)) == [30, 71, 104]  # past 80 and the last: one
    assert late_stop_positions([1, 2] * 50, eos) == []                            # nothing new past 16

    def gen(ids, finish):
        return [GenerationOut(token_ids=ids, finish_reason=finish)]

    assert stop_problems(gen([5, 6, 7], "stop"), exp, stops, [True], eos, n) == []
    assert stop_problems(gen([5, 9, 3], "length"), exp, stops, [True], eos, n) == []  # diverged, never saw 7
    assert "did not end there" in stop_problems(gen([5, 6, 7, 8], "length"), exp, stops, [True], eos, n)[0]
    assert "stop id 7 at token 1" in stop_problems(gen([5, 7, 8], "length"), exp, stops, [True], eos, n)[0]
    assert "with finish 'length'" in stop_problems(gen([5, 6, 7], "length"), exp, stops, [True], eos, n)[0]
    assert "no stop id" in stop_problems(gen([5, 6, 8], "stop"), exp, stops, [True], eos, n)[0]
    # an EOS ends the request too unless ignore_eos
    assert stop_problems(gen([5, 0], "stop"), exp, stops, [False], eos, n) == []
    assert stop_problems(gen([5, 0], "stop"), exp, stops, [True], eos, n) != []
    assert stop_problems(gen([5, 0, 6, 7], "stop"), exp, stops, [False], eos, n) != []


def test_small_sample_slack() -> None:
    assert small_sample_slack(0.03, 64) == pytest.approx(2 * math.sqrt(0.03 * 0.97 / 64))
    assert small_sample_slack(0.03, 10_000) < 0.004 and small_sample_slack(0.0, 64) == 0.0
    assert small_sample_slack(0.03, 0) == 0.0


def test_ignore_eos_lengths_are_exact() -> None:
    outs = [GenerationOut(token_ids=[1, 2, 3], finish_reason="length"),
            GenerationOut(token_ids=[1, 2], finish_reason="stop"),
            GenerationOut(token_ids=[1, 2], finish_reason="stop")]
    # request 1: ignore_eos, nothing may end it early; request 2: EOS allowed (not exact)
    problems = length_problems(outs, [3, 3, 3], [5, 5, 5], 100, exact=[True, True, False])
    assert len(problems) == 1 and problems[0].startswith("request 1:") and "expected exactly 3" in problems[0]
    # the context limit caps the exact count
    assert length_problems([GenerationOut(token_ids=[1, 2], finish_reason="length")], [8], [98], 100,
                           exact=[True]) == []


def test_new_sizes_default_cheap_and_validated() -> None:
    sizes = CheckSizes()
    assert sizes.n_sampling_prompts * 2 * sizes.n_samples <= 512 and sizes.sampling_top_k < 64
    assert H.TINY_CHECKS.late_tokens == 300 and H.TINY_CHECKS.n_long == 2
    with pytest.raises(ValueError):
        CheckSizes(sampling_top_k=64)


def test_natural_length_counts_only_outputs_that_agree_up_to_a_stop() -> None:
    from seis.evaluator.checks import length_ratio

    def out(ids, finish="stop"):
        return GenerationOut(token_ids=ids, finish_reason=finish)

    ref = [out([1, 2, 3, 0]), out([4, 5, 0]), out([6, 7, 8, 9, 0])]
    # A missed stop (same tokens, then more) and a cut (a prefix) are counted ...
    assert length_ratio(ref, [out([1, 2, 3, 0, 5, 5], "length"), ref[1], ref[2]], [True] * 3) == 14 / 12
    assert length_ratio(ref, [out([1, 2], "length"), ref[1], ref[2]], [True] * 3) == 10 / 12
    # ... a rounding divergence is a different text: its length is not compared (its tokens are, elsewhere).
    assert length_ratio(ref, [out([1, 9, 9, 9, 9, 9, 9, 0]), ref[1], ref[2]], [True] * 3) == 1.0
    assert length_ratio(ref, [out([9, 0]), out([9, 0]), out([9, 0])], [True] * 3) == 1.0
    assert length_ratio(ref, [out([1, 2], "length"), ref[1], ref[2]], [False, True, True]) == 1.0
