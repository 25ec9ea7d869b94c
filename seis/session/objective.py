"""What a run optimises (RunConfig.objective) and the retain rule's speed half: a candidate that passes every check is
still not retained when it is slower than its parent, or than vanilla, beyond measured noise on a timed workload of
the objective.

- "single": the one-request-at-a-time dev workloads (latency-bound decode);
- "throughput": the batched dev workload (a server with many requests in flight);
- "both" (the default on CUDA): all of them; an engine that wins one and loses the other is not retained;
- "none" (the default elsewhere): the gate's checks alone; a CPU's timings say nothing of the GPU engine it targets.

"Beyond measured noise": the candidate's tok/s over the gate's repetitions (min–max) lies wholly below its parent's,
measured in the same gate, interleaved (`progress.within_noise`, the rule the best-engine pick uses too), each
repetition's tok/s taken over vanilla's in that repetition (the same prompts), so that what a repetition's prompts
do to every engine alike is not counted as noise (`_paired`). Overlapping ranges are noise, whichever way the
medians lean. The candidate is held to vanilla's (raw) range too, and to vanilla's alone where the parent has no
timing on a workload: the parent is untrusted (an earlier candidate), and an engine can tell when it is timed as a
parent (it is asked no correctness calls), so a parent that runs slowly there lowered its own bar for every child;
and steps each within noise of their parent added up, session after session, to an engine slower than vanilla
beyond noise, retained at every step.
"""
from __future__ import annotations

from typing import Literal

from ..evaluator.schema import SpeedStat
from .progress import within_noise

Objective = Literal["single", "throughput", "both", "none"]
OBJECTIVES: tuple[str, ...] = ("single", "throughput", "both", "none")


def _counts(batch: int, objective: str) -> bool:
    return objective == "both" or (objective != "none" and (objective == "single") == (batch == 1))


def slower_than_parent(speed, objective: str = "both") -> list[str]:
    """One line per timed workload of the objective on which the candidate is slower than its parent beyond the
    measured noise (speed: the gate's SpeedTable, or None when speed was not measured)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    if speed is None:
        return []
    batch = {w.name: w.batch for w in speed.workloads}
    rows = {(r.workload, r.engine): r for r in speed.rows}
    out = []
    for name, b in batch.items():
        cand = rows.get((name, "candidate"))
        if not _counts(b, objective) or cand is None or cand.tok_per_s is None:
            continue
        # A parent with no timing (it failed, or ran out of its time: an earlier candidate can do so on purpose as
        # a parent) leaves vanilla to compare with, never no comparison at all; a timed one is no floor either (it
        # can run slowly on purpose as a parent), so vanilla, the trusted engine, is always one.
        parent, vanilla = rows.get((name, "parent")), rows.get((name, "vanilla"))
        timed = parent is not None and parent.tok_per_s is not None
        bases = [(parent, "its parent"), (vanilla, "vanilla")] if timed else \
            [(vanilla, "vanilla (its parent was not timed)")]
        for base, whom in bases:
            if base is None or base.tok_per_s is None:
                continue
            c, p = cand.tok_per_s, base.tok_per_s
            paired = None if base is vanilla or speed.parent_is_vanilla else \
                _paired(c, p, vanilla.tok_per_s if vanilla is not None else None)
            if paired is not None:
                pc, pp = paired
                slower = not within_noise(pc, pp) and pc.median < pp.median
                how = (f"; per repetition {pc.min:.3f}–{pc.max:.3f}x vanilla's tok/s on the same prompts, against "
                       f"{pp.min:.3f}–{pp.max:.3f}x")
            else:
                slower, how = not within_noise(c, p) and c.median < p.median, ""
            if slower:
                out.append(f"slower than {whom} on {name} beyond the measured noise: {c.median:.1f} tok/s "
                           f"({c.min:.1f}–{c.max:.1f}) against {p.median:.1f} ({p.min:.1f}–{p.max:.1f}){how}")
                break
    return out


def _paired(cand, parent, vanilla) -> tuple[SpeedStat, SpeedStat] | None:
    """The candidate's and the parent's tok/s per repetition, each over vanilla's in the same repetition (the same
    prompts, calls interleaved), or None where they cannot be paired. Every repetition times other prompts, and on
    natural-length workloads their lengths alone moved every engine's tok/s alike by several percent (E0 at 565.6–
    612.3 tok/s one request at a time, 7,419.9–8,112.7 batched, on an H100 whose fixed-length range was
    641.6–641.9): compared as raw ranges, that spread read as noise, and a candidate slower than its parent in
    every repetition by as much was retained. Over vanilla, what the prompts do to all engines cancels; what the
    machine does to each does not."""
    if vanilla is None or not (len(cand.values) == len(parent.values) == len(vanilla.values) > 0) \
            or min(vanilla.values) <= 0:
        return None
    return (SpeedStat.of([c / v for c, v in zip(cand.values, vanilla.values)]),
            SpeedStat.of([p / v for p, v in zip(parent.values, vanilla.values)]))
