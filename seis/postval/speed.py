"""Timed generation through the engine processes, the statistics of repeated timings, and the check of every
timed output against vanilla's.

Repetitions alternate the engine order (A B, B A, A B, ...) so slow drift (thermal, clocks, other load)
falls on both engines alike; throughput counts generated tokens over wall time, prefill included. Unlike the
gate (per-request interleaving), whole passes alternate here: NVML's energy counter can only be attributed to an
engine over a stretch in which that engine alone ran -- and while one engine is timed (or warmed up) the other's
whole sandbox is frozen (SIGSTOP), so nothing of it runs meanwhile: a candidate that runs anyway (it had the
kernel resume it) fails (alone).

Every byte from an engine process is untrusted: replies are checked for shape, a reply counts at most
max_new_tokens tokens, and every token of the candidate's timed outputs is scored by vanilla, teacher-forced on
the candidate's own output, and every stop and length is judged, by the gate's own timed checks (judge_timed): a
speed figure measured on outputs that vanilla would not have produced, up to a near-tie, is flagged as not
trustworthy (timed_check).
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from ..engine_host.gpu_idle import GpuIdle
from .bandwidth import EnergyMeter, mean_decode_context
from .result import (
    ENGINES,
    EngineName,
    LatencyStats,
    LengthStats,
    SpeedComparison,
    SpeedMeasure,
    Spread,
    TimedCheck,
)

if TYPE_CHECKING:
    from ..engine_host import EngineProcess
    from ..engine_host.client import Sampling
    from ..evaluator.gate_config import GateThresholds
    from ..evaluator.schema import Calibration, CheckResult
    from .plan import TimedSet
    from .postval_config import PostValConfig


@dataclass(frozen=True)
class Timing:
    """One repetition of one workload on one engine; outputs aligned with the prompts (None: no usable reply)."""
    wall_s: float
    latencies: list[float]  # per request in single mode; [wall_s] in batch mode
    outputs: list[list[int] | None]
    finish: list[str]
    energy_j: float | None
    tokens: int  # counted: each reply's first max_new_tokens tokens
    extra_replies: int = 0  # replies beyond one per request


# ---- statistics ----------------------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spread(values: Sequence[float]) -> Spread:
    return Spread(median=statistics.median(values), min=min(values), max=max(values), values=list(values))


def latency_stats(values: Sequence[float]) -> LatencyStats:
    """Mean, median and the central 50 % (25-75) and 80 % (10-90) intervals."""
    return LatencyStats(n=len(values), mean=statistics.fmean(values), median=statistics.median(values),
                        p10=percentile(values, 10), p25=percentile(values, 25), p75=percentile(values, 75),
                        p90=percentile(values, 90))


def length_stats(lengths: Sequence[int], finish: Sequence[str]) -> LengthStats:
    return LengthStats(n=len(lengths), mean=statistics.fmean(lengths), median=statistics.median(lengths),
                       min=min(lengths), max=max(lengths), p10=percentile(lengths, 10),
                       p90=percentile(lengths, 90), capped_frac=sum(f == "length" for f in finish) / len(finish))


# ---- timing --------------------------------------------------------------------------------------------------

def _reply_outputs(engine: EngineProcess, raw: object) -> list[tuple[list[int], str]]:
    """A generate reply as (token ids, finish reason) pairs; anything else is the engine's error. The client keeps
    no more of a reply than the request can be judged by (engine_host.client.bounded_generations): a set holds
    every output of every repetition until it is judged."""
    from ..engine_host import EngineError

    if not isinstance(raw, list):
        raise EngineError(f"{engine.engine_dir}: generate replied {type(raw).__name__}, not a list")
    out = []
    for r in raw:
        ids = r.get("token_ids") if isinstance(r, dict) else None
        fin = r.get("finish_reason") if isinstance(r, dict) else None
        if not isinstance(ids, list) or not all(type(t) is int for t in ids) or not isinstance(fin, str):
            raise EngineError(f"{engine.engine_dir}: malformed generate reply {str(r)[:200]!r}")
        out.append((ids, fin))
    return out


def run_once(engine: EngineProcess, prompts: Sequence[Sequence[int]], sampling: Sampling, mode: str,
             meter: EnergyMeter) -> Timing:
    """single: one request per generate call (latency); batch: all prompts in one call (throughput)."""
    e0 = meter.read_j()
    latencies: list[float] = []
    replies: list[list[tuple[list[int], str]]] = []
    start = time.perf_counter()
    if mode == "single":
        for p in prompts:
            t0 = time.perf_counter()
            replies.append(_reply_outputs(engine, engine.generate([list(p)], sampling)))
            latencies.append(time.perf_counter() - t0)
    elif mode == "batch":
        batch = _reply_outputs(engine, engine.generate([list(p) for p in prompts], sampling))
        replies = [batch[i:i + 1] for i in range(len(prompts))] + ([batch[len(prompts):]] if batch[len(prompts):]
                                                                     else [])
    else:
        raise ValueError(f"unknown mode {mode!r}")
    wall = time.perf_counter() - start
    e1 = meter.read_j()
    outputs = [r[0][0] if r else None for r in replies[: len(prompts)]]
    extra = sum(max(0, len(r) - 1) for r in replies[: len(prompts)]) + sum(len(r) for r in replies[len(prompts):])
    return Timing(wall_s=wall, latencies=latencies or [wall], outputs=outputs,
                  finish=[r[0][1] if r else "missing" for r in replies[: len(prompts)]],
                  energy_j=None if e0 is None or e1 is None else e1 - e0,
                  tokens=sum(min(len(o), sampling.max_new_tokens) for o in outputs if o is not None),
                  extra_replies=extra)


@contextmanager
def alone(engines: Mapping[EngineName, EngineProcess], name: EngineName, idle: GpuIdle | None = None
          ) -> Iterator[None]:
    """Every other engine's sandbox frozen for the block (thawed afterwards, also on errors); with `idle`, the
    block starts once the GPU has finished what the others left queued. A frozen engine whose processes ran
    meanwhile (the kernel resumes a stopped process on a SIGCONT it arranged itself, a POSIX timer's) may have
    run beside the one in the block: see ran_while_frozen."""
    others = [n for n, e in engines.items() if n != name and getattr(e, "box", None) is not None]
    frozen = []
    try:
        for n in others:
            freeze(engines, n)
            frozen.append(n)
        if idle is not None:
            idle.wait()
        yield
    finally:
        ran = [n for n in frozen if engines[n].box.thaw()]
        if ran:
            ran_while_frozen(engines, ran)


def freeze(engines: Mapping[EngineName, EngineProcess], name: EngineName) -> None:
    """Freeze one engine's sandbox. One whose processes do not stay stopped (they resume each other, so SIGSTOPs
    keep missing some; the freeze gives up after its timeout) would run beside the engine timed next: raised as that
    engine's doing (_charge), as running while frozen is, not as a SandboxError that ended post-validation with a
    traceback naming neither engine."""
    from ..sandbox import SandboxError

    try:
        engines[name].box.freeze()
    except SandboxError as e:
        _charge(engines, [name], f"its processes did not stay frozen for the other engine's timed or warm-up "
                                 f"requests ({e})", "so the host kept it running")


def ran_while_frozen(engines: Mapping[EngineName, EngineProcess], ran: Sequence[EngineName]) -> None:
    """Raises for engines that ran while frozen (_charge). Vanilla is trusted, and nothing of the candidate's can
    resume it."""
    _charge(engines, ran, "its processes ran while it was frozen for the other engine's timed or warm-up requests",
            "so the host resumed it")


def _charge(engines: Mapping[EngineName, EngineProcess], names: Sequence[EngineName], message: str,
            host_cause: str) -> NoReturn:
    """The candidate's misbehaviour is its failure, as any other (EngineError): what was timed beside it, and so its
    ratio, cannot be trusted. Vanilla's is a host failure (HostFailure): vanilla is trusted."""
    from ..engine_host import EngineError
    from ..evaluator.errors import HostFailure

    if "candidate" in names:
        raise EngineError(f"{engines['candidate'].engine_dir}: {message}")
    raise HostFailure(f"vanilla ({engines['vanilla'].engine_dir}): {message}; vanilla is trusted, {host_cause}: "
                      f"no result")


def measure_pair(engines: Mapping[EngineName, EngineProcess], rep_prompts: Sequence[Sequence[Sequence[int]]],
                 sampling: Sampling, mode: str, meter: EnergyMeter, idle: GpuIdle | None = None
                 ) -> dict[EngineName, list[Timing]]:
    """Repetition r times rep_prompts[r] on both engines, one engine at a time (the other frozen, the GPU idle)."""
    timings: dict[EngineName, list[Timing]] = {name: [] for name in ENGINES}
    for rep, prompts in enumerate(rep_prompts):
        order = ENGINES if rep % 2 == 0 else tuple(reversed(ENGINES))
        for name in order:
            with alone(engines, name, idle):
                timings[name].append(run_once(engines[name], prompts, sampling, mode, meter))
    return timings


def warm_up(engine: EngineProcess, prompts: Sequence[Sequence[int]], sampling_cls: type) -> None:
    """First calls pay one-off costs (allocator growth, kernel compilation); keep them out of the timings. The
    prompts are never timed (plan.speed_plan reserves them)."""
    if not prompts:
        return
    s = sampling_cls(max_new_tokens=8, ignore_eos=True)
    engine.generate([list(prompts[0])], s)
    engine.generate([list(prompts[i % len(prompts)]) for i in range(8)], s)


# ---- the timed outputs against vanilla's -----------------------------------------------------------------------

def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class VanillaScorer:
    """Vanilla's score call in the form the gate's checks take: replies validated, and since vanilla is the trusted
    reference, a malformed one is an error, not a verdict."""

    def __init__(self, vanilla: EngineProcess):
        self.vanilla = vanilla

    def score(self, prompts: list[list[int]], continuations: list[list[int]], top_k: int) -> list:
        from pydantic import TypeAdapter, ValidationError

        from ..engine_host import EngineError
        from ..evaluator.engines import ScoreOut

        where = self.vanilla.engine_dir
        raw = self.vanilla.score(prompts, continuations, top_k=top_k)
        if not isinstance(raw, list) or len(raw) != len(continuations):
            raise EngineError(f"{where}: score replied to {len(continuations)} timed outputs with "
                              f"{len(raw) if isinstance(raw, list) else type(raw).__name__}")
        try:
            scores = TypeAdapter(list[ScoreOut]).validate_python(raw)
        except ValidationError as exc:
            raise EngineError(f"{where}: malformed score reply: {str(exc)[:200]}") from None
        for o, sc in zip(continuations, scores):
            if not len(sc.token_logprobs) == len(sc.top_logprobs) == len(o) or not all(sc.top_logprobs):
                raise EngineError(f"{where}: malformed score reply for {len(o)} tokens: {str(sc)[:200]}")
        return scores


@dataclass(frozen=True)
class TimedRules:
    """What the gate's timed checks need besides the outputs; tolerances from PostValConfig."""
    thresholds: GateThresholds
    calibration: Calibration
    eos_ids: list[int]
    eos_scale: float
    vocab: int
    context: int


def timed_rules(c: PostValConfig, eos_ids: list[int], eos_scale: float, vocab: int, context: int) -> TimedRules:
    from ..evaluator.gate_config import GateThresholds
    from ..evaluator.schema import Calibration

    # Rounded so that timed_min_valid itself lies on the passing side of 1 - (1 - timed_min_valid).
    tolerance = {"top1": round(1 - c.timed_min_valid, 12), "length": c.timed_length_tolerance}
    return TimedRules(GateThresholds(greedy_margin=c.timed_margin),
                      Calibration(method="post-validation: configured", noise={}, tolerance=tolerance, positions=0,
                                  requests=0), list(eos_ids), eos_scale, vocab, context)


def judge_timed(vanilla_scorer, workload: str, prompts: Sequence[Sequence[Sequence[int]]], sampling: Sampling,
                timings: Mapping[EngineName, Sequence[Timing]], rules: TimedRules) -> list[CheckResult]:
    """The gate's timed checks (evaluator.timed) on one timed set, every repetition: each request answered, lengths
    and EOS rules, every candidate token vanilla's top-1 up to a near-tie, every stop within the stop margin, and
    at natural length the lengths where the texts agree up to a stop and the direction of early ends.
    prompts: per repetition, per request."""
    from ..evaluator.engines import GenerationOut
    from ..evaluator.speed import TimedOutputs
    from ..evaluator.timed import timed_checks
    from ..evaluator.workloads import PromptSet

    sets = [PromptSet(workload, tuple(str(i) for i in range(len(rep))), tuple(tuple(p) for p in rep),
                      (sampling,) * len(rep)) for rep in prompts]
    outputs = {n: [[None if o is None else GenerationOut(token_ids=o, finish_reason=f)
                    for o, f in zip(t.outputs, t.finish, strict=True)] for t in timings[n]] for n in ENGINES}
    timed = TimedOutputs(sets={workload: sets}, outputs={workload: outputs})
    return timed_checks(vanilla_scorer, timed, rules.calibration, rules.thresholds, rules.eos_ids, rules.vocab,
                        rules.context, rules.eos_scale)


def timed_check(cand: Sequence[Timing], van: Sequence[Timing], max_new_tokens: int,
                checks: Sequence[CheckResult]) -> TimedCheck:
    """Pairs the candidate's output for each timed request (every repetition) with vanilla's for the same one;
    checks: judge_timed's. Flagged when any of them fails, or a request got more than one reply. Token-identical
    outputs and the first divergence are reported: bf16 engines that round differently part at near-ties and
    stay valid."""
    extra = sum(t.extra_replies for t in cand)
    n = identical = div = 0
    len_c = len_v = over = 0
    missing = extra
    for tc, tv in zip(cand, van, strict=True):
        for oc, ov in zip(tc.outputs, tv.outputs, strict=True):
            ov = ov or []
            n += 1
            if oc is None:
                missing += 1
                oc = []
            over += len(oc) > max_new_tokens
            identical += oc == ov
            div += first_divergence(oc, ov)
            len_c += min(len(oc), max_new_tokens)
            len_v += len(ov)
    reasons = [f"{c.name.rsplit('.', 1)[-1]}: {c.detail}" for c in checks if not c.passed]
    if extra:
        reasons.append(f"{extra} replies beyond one per request")
    valid = next((c.value for c in checks if c.name.endswith(".greedy_valid") and c.value is not None), None)
    ratio = len_c / len_v if len_v else (1.0 if not len_c else math.inf)
    return TimedCheck(requests=n, identical_frac=identical / n if n else 1.0,
                      first_divergence_mean=div / n if n else 0.0, valid_frac=1.0 if valid is None else valid,
                      length_ratio=ratio if math.isfinite(ratio) else 1e9, missing=missing, over_length=over,
                      flagged=bool(reasons), reasons=reasons, checks=list(checks))


# ---- summaries -----------------------------------------------------------------------------------------------

BoundFn = Callable[[EngineName, float], "float | None"]


def summarize_measure(name: EngineName, timings: Sequence[Timing], prompt_lens: Sequence[int], mode: str,
                      max_new_tokens: int, bound: BoundFn | None = None) -> SpeedMeasure:
    """prompt_lens: every timed request's, repetitions one after another (as the outputs)."""
    outs = [o or [] for t in timings for o in t.outputs]
    out_lens = [min(len(o), max_new_tokens) for o in outs]
    finish = [f for t in timings for f in t.finish]
    energies = [t.energy_j / t.tokens for t in timings if t.energy_j is not None and t.tokens]
    latency = None
    mean_ctx = bound_value = None
    per_request: list[float] = []
    if mode == "single":
        per_request = [lat for t in timings for lat in t.latencies]
        latency = latency_stats(per_request)
        mean_ctx = mean_decode_context(prompt_lens, out_lens)
        bound_value = bound(name, mean_ctx) if bound else None
    return SpeedMeasure(
        engine=name, tok_per_s=spread([t.tokens / t.wall_s for t in timings]),
        wall_s=spread([t.wall_s for t in timings]), tokens=[t.tokens for t in timings],
        output_lengths=length_stats(out_lens, finish), latency=latency, mean_context=mean_ctx,
        bound_tok_per_s=bound_value, energy_j_per_token=spread(energies) if len(energies) == len(timings) else None,
        request_new_tokens=out_lens if per_request else [], request_latency_s=per_request)


def compare(ts: TimedSet, sampling: Sampling, timings: dict[EngineName, list[Timing]],
            checks: Sequence[CheckResult], bound: BoundFn | None = None) -> SpeedComparison:
    """checks: judge_timed's on this set."""
    lens = [len(p.tokens) for rep in ts.reps for p in rep]
    cand = summarize_measure("candidate", timings["candidate"], lens, ts.mode, sampling.max_new_tokens, bound)
    van = summarize_measure("vanilla", timings["vanilla"], lens, ts.mode, sampling.max_new_tokens, bound)
    # Repetition i of A and of B ran back to back on the same prompts: pair them.
    ratios = [a / b for a, b in zip(cand.tok_per_s.values, van.tok_per_s.values, strict=True)]
    check = timed_check(timings["candidate"], timings["vanilla"], sampling.max_new_tokens, checks)
    return SpeedComparison(workload=ts.workload, kind=ts.kind, mode=ts.mode, requests=ts.requests,
                           max_new_tokens=sampling.max_new_tokens, ignore_eos=sampling.ignore_eos,
                           prompt_len_mean=statistics.fmean(lens), candidate=cand, vanilla=van,
                           speedup=spread(ratios), requested=ts.requested,
                           prompt_ids=[[p.id for p in rep] for rep in ts.reps], distinct_prompts=ts.distinct,
                           timed=check)
