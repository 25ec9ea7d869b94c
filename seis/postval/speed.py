"""Timed generation through the engine processes, and the statistics of repeated timings.

Repetitions alternate the engine order (A B, B A, A B, ...) so slow drift (thermal, clocks, other load)
falls on both engines alike; throughput counts generated tokens over wall time, prefill included. Unlike the
gate (per-request interleaving), whole passes alternate here: NVML's energy counter can only be attributed to an
engine over a stretch in which that engine alone ran.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .bandwidth import EnergyMeter, mean_decode_context
from .result import ENGINES, EngineName, LatencyStats, LengthStats, SpeedComparison, SpeedMeasure, Spread

if TYPE_CHECKING:
    from ..engine_host import EngineProcess
    from ..engine_host.client import Sampling


@dataclass(frozen=True)
class Timing:
    """One repetition of one workload on one engine."""
    wall_s: float
    latencies: list[float]  # per request in single mode; [wall_s] in batch mode
    outputs: list[list[int]]
    finish: list[str]
    energy_j: float | None

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


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

def run_once(engine: EngineProcess, prompts: Sequence[list[int]], sampling: Sampling, mode: str,
             meter: EnergyMeter) -> Timing:
    """single: one request per generate call (latency); batch: all prompts in one call (throughput)."""
    e0 = meter.read_j()
    latencies, outs = [], []
    start = time.perf_counter()
    if mode == "single":
        for p in prompts:
            t0 = time.perf_counter()
            outs += engine.generate([list(p)], sampling)
            latencies.append(time.perf_counter() - t0)
    elif mode == "batch":
        outs = engine.generate([list(p) for p in prompts], sampling)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    wall = time.perf_counter() - start
    e1 = meter.read_j()
    return Timing(wall_s=wall, latencies=latencies or [wall], outputs=[o["token_ids"] for o in outs],
                  finish=[o["finish_reason"] for o in outs],
                  energy_j=None if e0 is None or e1 is None else e1 - e0)


def measure_pair(engines: dict[EngineName, EngineProcess], prompts: Sequence[list[int]], sampling: Sampling,
                 mode: str, reps: int, meter: EnergyMeter) -> dict[EngineName, list[Timing]]:
    timings: dict[EngineName, list[Timing]] = {name: [] for name in ENGINES}
    for rep in range(reps):
        order = ENGINES if rep % 2 == 0 else tuple(reversed(ENGINES))
        for name in order:
            timings[name].append(run_once(engines[name], prompts, sampling, mode, meter))
    return timings


def warm_up(engine: EngineProcess, prompts: Sequence[list[int]], sampling_cls: type) -> None:
    """First calls pay one-off costs (allocator growth, kernel compilation); keep them out of the timings."""
    s = sampling_cls(max_new_tokens=8, ignore_eos=True)
    engine.generate([list(prompts[0])], s)
    engine.generate([list(p) for p in prompts[:8]], s)


# ---- summaries -----------------------------------------------------------------------------------------------

BoundFn = Callable[[EngineName, float], "float | None"]


def summarize_measure(name: EngineName, timings: Sequence[Timing], prompt_lens: Sequence[int], mode: str,
                      bound: BoundFn | None = None) -> SpeedMeasure:
    first = timings[0]
    out_lens = [len(o) for o in first.outputs]
    deterministic = all(t.outputs == first.outputs for t in timings)
    energies = [t.energy_j / t.tokens for t in timings if t.energy_j is not None and t.tokens]
    latency = None
    mean_ctx = bound_value = None
    per_request: list[float] = []
    if mode == "single":
        per_request = [statistics.median(lat) for lat in zip(*(t.latencies for t in timings), strict=True)]
        latency = latency_stats(per_request)
        mean_ctx = mean_decode_context(prompt_lens, out_lens)
        bound_value = bound(name, mean_ctx) if bound else None
    return SpeedMeasure(
        engine=name, tok_per_s=spread([t.tokens / t.wall_s for t in timings]),
        wall_s=spread([t.wall_s for t in timings]),
        tokens=[t.tokens for t in timings], deterministic=deterministic,
        output_lengths=length_stats(out_lens, first.finish), latency=latency, mean_context=mean_ctx,
        bound_tok_per_s=bound_value, energy_j_per_token=spread(energies) if len(energies) == len(timings) else None,
        request_new_tokens=out_lens if per_request else [], request_latency_s=per_request)


def compare(workload: str, kind: str, mode: str, sampling: Sampling, prompts: Sequence[Sequence[int]],
            timings: dict[EngineName, list[Timing]], bound: BoundFn | None = None) -> SpeedComparison:
    lens = [len(p) for p in prompts]
    cand = summarize_measure("candidate", timings["candidate"], lens, mode, bound)
    van = summarize_measure("vanilla", timings["vanilla"], lens, mode, bound)
    # Repetition i of A and of B ran back to back: pair them.
    ratios = [a / b for a, b in zip(cand.tok_per_s.values, van.tok_per_s.values, strict=True)]
    return SpeedComparison(workload=workload, kind=kind, mode=mode, requests=len(prompts),
                           max_new_tokens=sampling.max_new_tokens, ignore_eos=sampling.ignore_eos,
                           prompt_len_mean=statistics.fmean(lens), candidate=cand, vanilla=van,
                           speedup=spread(ratios))
