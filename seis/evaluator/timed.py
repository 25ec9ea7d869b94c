"""The timed path is a checked path: every output the candidate produced while it was being timed is judged
against the reference on those same requests, so an engine cannot be fast only where nobody looks (a batch-of-one
shortcut, layers skipped late in long outputs, junk while pinned, early fake EOS).

Per speed workload, over all repetitions: every request answered; lengths and EOS rules; greedy token agreement
with the reference's own timed outputs; the reference's scoring of the candidate's tokens (each its top-1 up to a
near-tie); every EOS the candidate stopped at must be within the stop margin of the reference's top-1 there, and
no token it chose where the reference's top-1 is an EOS may lie beyond that margin below it (missed stops); at
natural length the summed output length must match the reference's where the texts agree up to a stop, and the
candidate must not end early on clearly more requests than it ends late. Tolerances are the correctness checks'
calibrated ones; the stop margin is calibrated here, on the reference's own timed stops and on how much larger the
model's EOS output row is than the rest (`stop_tolerance`).
"""
from __future__ import annotations

from .checks import (
    answer_problems,
    early_ends,
    eos_problems,
    greedy_agreement,
    length_problems,
    length_ratio,
    near_argmax,
    scoreable,
)
from .engines import EngineHandle, GenerationOut
from .gate_config import GateThresholds
from .schema import Calibration, CheckResult
from .speed import TimedOutputs


def _flat(timed: TimedOutputs, workload: str, engine: str):
    prompts = [p for ps in timed.sets[workload] for p in ps.prompts]
    sampling = [s for ps in timed.sets[workload] for s in ps.sampling]
    outs = [o for rep in timed.outputs[workload].get(engine, []) for o in rep]
    return prompts, sampling, outs


def _stop_gaps(scores, outs: list[GenerationOut]) -> list[float | None]:
    """Per output: how far below the scorer's top-1 its final EOS lies (nats), or None where it did not stop."""
    return [s.top_logprobs[-1][0] - s.token_logprobs[-1]
            if out.finish_reason == "stop" and s.token_logprobs and s.top_logprobs[-1] else None
            for s, out in zip(scores, outs)]


def stop_tolerance(reference_gaps: list[float], floor: float, factor: float, cap: float,
                   scaled_margin: float = 0.0) -> tuple[float, float]:
    """(noise, tolerance) for stops. The reference chose EOS at each of its own timed stops, yet scoring the same
    tokens teacher-forced can rank it below its top-1: the EOS logit can be the noisiest one (a random model's
    calibrated EOS row is large), and this gap is the reference's own noise at a stop. scaled_margin: the greedy
    near-tie margin scaled to an EOS-vs-top-1 gap (`logit_scale.eos_gap_scale`). tolerance = min(cap, max(floor,
    factor * the largest such gap, scaled_margin))."""
    noise = max(reference_gaps, default=0.0)
    return noise, min(cap, max(floor, factor * noise, scaled_margin))


def _false_stops(gaps: list[float | None], outs: list[GenerationOut], tolerance: float) -> list[str]:
    return [f"request {i}: stopped at token {out.token_ids[-1]} after {len(out.token_ids)} tokens, {gap:.2f} nats "
            f"below the reference's top-1 there" for i, (gap, out) in enumerate(zip(gaps, outs))
            if gap is not None and gap > tolerance]


def _missed_stops(scores, outs: list[GenerationOut], enders: list[set[int]], tolerance: float) -> list[str]:
    """The mirror of _false_stops: per output, the first token the candidate chose where the scorer's top-1 is an
    EOS (or stop id) that leads it by more than the stop margin. greedy_valid counts such a token only as one wrong
    token among many, within its rate; but each one is a request run past its end, and an engine that passes over
    clear EOS in a few percent of its tokens makes batch rows run on for the wall time the longest row sets anyway
    (more tokens counted per call) while ignoring a stop condition. An honest engine goes on past the reference's EOS
    only where rounding puts its own pick above it, a gap as small as at the stops _false_stops bounds, so both use
    the same margin."""
    problems = []
    for i, (s, out, stop) in enumerate(zip(scores, outs, enders)):
        for k, (tok, lp, top_ids, top_lps) in enumerate(zip(out.token_ids, s.token_logprobs, s.top_ids,
                                                            s.top_logprobs)):
            if tok not in stop and top_ids and top_ids[0] in stop and top_lps[0] - lp > tolerance:
                problems.append(f"request {i}: token {k} went on past an EOS/stop id the reference puts "
                                f"{top_lps[0] - lp:.2f} nats above it")
                break
    return problems


def _reference_stop_gaps(ref: EngineHandle, timed: TimedOutputs, vocab: int, max_seq_len: int) -> list[float]:
    """The reference's scoring of its own timed natural-length outputs, at the stops it made."""
    present = []
    for wl in timed.sets:
        prompts, sampling, van = _flat(timed, wl, "vanilla")
        present += [(p, o) for p, s, o in zip(prompts, sampling, van) if o is not None and not s.ignore_eos
                    and o.finish_reason == "stop" and scoreable(p, o, s.max_new_tokens, vocab, max_seq_len)]
    scores = ref.score([list(p) for p, _ in present], [o.token_ids for _, o in present], top_k=1) \
        if present else []
    return [g for g in _stop_gaps(scores or [], [o for _, o in present]) if g is not None]


def timed_checks(ref: EngineHandle, timed: TimedOutputs, cal: Calibration, th: GateThresholds, eos_ids: list[int],
                 vocab: int, max_seq_len: int, eos_scale: float = 1.0) -> list[CheckResult]:
    """eos_scale: how much more rounding moves an EOS-vs-top-1 gap than an ordinary near-tie (at least 1)."""
    tol, margin = cal.tolerance, th.greedy_margin
    stop_noise, stop_tol = stop_tolerance(_reference_stop_gaps(ref, timed, vocab, max_seq_len), th.stop_margin,
                                          th.stop_factor, th.stop_cap, margin * eos_scale)
    checks: list[CheckResult] = []
    for wl in timed.sets:
        prompts, sampling, cand = _flat(timed, wl, "candidate")
        _, _, van = _flat(timed, wl, "vanilla")
        name = f"timed.{wl}"
        n = len(prompts)
        answered = [f"request {i}: no reply" for i, o in enumerate(cand) if o is None] if cand else \
            answer_problems(n, None, "timed generate")
        if len(cand) not in (0, n):
            answered.append(f"{len(cand)} timed replies for {n} requests")
        checks.append(CheckResult.rules(f"{name}.answered", answered, n))
        max_new = [s.max_new_tokens for s in sampling]
        checks.append(CheckResult.rules(f"{name}.lengths",
                                        length_problems(cand, max_new, [len(p) for p in prompts], max_seq_len), n))
        checks.append(CheckResult.rules(f"{name}.eos", eos_problems(cand, [s.ignore_eos for s in sampling], eos_ids,
                                                                    [s.stop_token_ids for s in sampling]), n))
        present = [(p, o) for p, s, o in zip(prompts, sampling, cand)
                   if o is not None and scoreable(p, o, s.max_new_tokens, vocab, max_seq_len)]
        enders = [set(s.stop_token_ids) | (set() if s.ignore_eos else set(eos_ids)) for p, s, o
                  in zip(prompts, sampling, cand) if o is not None and scoreable(p, o, s.max_new_tokens, vocab,
                                                                                  max_seq_len)]
        total = sum(max(len(o.token_ids), 1) for o in cand if o is not None) or None
        scores = ref.score([list(p) for p, _ in present], [o.token_ids for _, o in present], top_k=1) \
            if present else []
        valid = near_argmax(scores, margin) if scores else 0
        # Timed outputs are long (256 tokens): a candidate whose kernels round differently meets near-ties and
        # diverges from the reference's text on most of them, so exactness is reported, not required; every
        # token of the candidate's own text must still be a near-argmax of the reference.
        agree = greedy_agreement([o for o in van if o is not None], [c for c, v in zip(cand, van) if v is not None])
        checks.append(CheckResult.bounded(
            f"{name}.greedy_valid", valid / total if total else None, lower=1 - tol["top1"],
            detail=f"{valid} of {total or 0} timed tokens are the reference's top-1 within {margin:g} nats; "
                   f"token-exact vs the reference's timed outputs: {agree.exact_rate:.3f} of {agree.requests}, "
                   f"mean first divergence at token {agree.mean_first_divergence:.1f}",
            extra={"exact_rate": agree.exact_rate, "mean_first_divergence": agree.mean_first_divergence}))
        stops = _false_stops(_stop_gaps(scores, [o for _, o in present]), [o for _, o in present], stop_tol)
        check = CheckResult.rules(f"{name}.stops", stops, n)
        checks.append(check.model_copy(update={
            "detail": f"{check.detail}; stop margin {stop_tol:.2f} nats (the reference's own largest gap at its "
                      f"timed stops: {stop_noise:.2f}; EOS logit noise {eos_scale:.2f}x an ordinary token's)",
            "extra": {**check.extra, "stop_margin": stop_tol, "reference_stop_noise": stop_noise,
                      "eos_scale": eos_scale}}))
        missed = CheckResult.rules(f"{name}.missed_stops", _missed_stops(scores, [o for _, o in present], enders,
                                                                         stop_tol), n)
        checks.append(missed.model_copy(update={"detail": f"{missed.detail}; stop margin {stop_tol:.2f} nats"}))
        natural = [not s.ignore_eos for s in sampling]
        if any(natural) and van and all(v is not None for v in van):
            ratio = length_ratio(van, cand, natural)
            checks.append(CheckResult.bounded(f"{name}.natural_length", ratio, 1 - tol["length"], 1 + tol["length"],
                                              detail="summed timed output length, candidate / reference"))
            ends = early_ends(van, cand, natural)
            checks.append(CheckResult.bounded(
                f"{name}.early_ends", ends.p, lower=th.early_end_p,
                detail=f"ended before the reference on {ends.shorter} and after it on {ends.longer} requests "
                       f"(one-sided sign test p = {ends.p:.3g})",
                extra={"shorter": float(ends.shorter), "longer": float(ends.longer)}))
    return checks
