"""Speed on the dev workloads: one request at a time, and (serving throughput) whole batches of fresh requests per
call; prefill included, engines interleaved per call.

Each prompt is run by every engine back to back, the order rotating from prompt to prompt and repetition to
repetition (A B C, B C A, C A B, ...), so drift of the machine (clocks, other load) within a pass hits all engines
alike. The ratios are paired per repetition: each pass's tok/s over the other engine's in the same pass (the
same prompts, their calls interleaved), median over repetitions, so one slow pass moves them little. A ratio is of
total throughput, as tok/s is: a median of per-request ratios called an engine fast on most requests and very slow
on a few faster than it was. Times are taken in the gate process around each request: prefill +
decode + a JSON round trip well under a millisecond, the same for every engine.

What keeps the numbers honest: every repetition times prompts no engine has seen before (SpeedWorkload), so a
cache of earlier answers earns nothing; while one engine is timed every other engine's sandbox is frozen
(SIGSTOP on all of its processes) and, on a GPU, the device is idle before the request starts, so no engine can
slow another down; and every timed output is kept, so the gate checks the timed path itself (timed.py).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from ..engine_host.affinity import pinned_frozen
from .engines import EngineHandle, GenerationOut
from ..engine_host.gpu_idle import GpuIdle
from .gate_config import SpeedConfig
from .schema import SpeedRow, SpeedStat, SpeedTable, SpeedWorkloadInfo
from .workloads import PromptSet, SpeedWorkload

METHOD = ("single request at a time (batched workloads: the pass's requests in one call), greedy, fresh dev prompts "
          "in every repetition; engines interleaved per call in rotating order, the others frozen and the GPU idle "
          "while one is timed; tok/s = generated tokens / summed call wall time of a pass; latency = median call "
          "wall time of a pass; median (min-max) over repetitions; ratios = median over repetitions of the paired "
          "per-pass tok/s ratios (same prompts, calls interleaved)")

Timing = tuple[int, float]  # generated tokens, wall seconds of one request


@dataclass
class TimedOutputs:
    """What each engine answered to each timed request, for the gate to check (timed.py)."""

    sets: dict[str, list[PromptSet]] = field(default_factory=dict)       # workload -> the repetitions' prompts
    outputs: dict[str, dict[str, list[list[GenerationOut | None]]]] = field(default_factory=dict)
    # workload -> engine -> repetition -> request


def _timed_call(engine: EngineHandle, others: list[EngineHandle], idle: GpuIdle, prompts: list[list[int]],
                samplings: list) -> tuple[Timing | None, list[GenerationOut] | None]:
    """One call (one request, or a batch of them) with every other engine frozen and the GPU drained first."""
    for other in others:
        other.freeze()
    try:
        idle.wait()
        t0 = time.perf_counter()
        out = engine.generate(prompts, samplings)
        elapsed = time.perf_counter() - t0
    finally:
        for other in others:
            other.thaw()
    if not out or len(out) != len(prompts):
        return None, None
    return (sum(len(o.token_ids) for o in out), elapsed), out


def _calls(ps: PromptSet, batch: int) -> list[tuple[list[list[int]], list]]:
    """The timed calls of a pass: each request alone, or the whole pass as one batch."""
    prompts, sampling = ps.prompt_lists(), list(ps.sampling)
    if batch > 1:
        return [(prompts, sampling)]
    return [([p], [s]) for p, s in zip(prompts, sampling)]


def _pass_tok_per_s(p: list[Timing]) -> float:
    """A pass's throughput: its generated tokens over its summed call wall time."""
    return sum(t for t, _ in p) / sum(s for _, s in p)


def _paired_ratio(a: list[list[Timing]], b: list[list[Timing]]) -> float | None:
    """Median over repetitions of tok/s(a) / tok/s(b) in the same pass (same prompts, calls interleaved). Per pass,
    not per request: the ratio must be what total throughput says, or an engine fast on most requests and very slow
    on a few shows a speedup it does not have. An engine that produced no tokens in a pass has ratio 0 there; a pass
    of the baseline without tokens has no ratio (None when no pass has one)."""
    ratios = [_pass_tok_per_s(ra) / tb for ra, rb in zip(a, b, strict=True) if (tb := _pass_tok_per_s(rb)) > 0]
    return statistics.median(ratios) if ratios else None


def measure_speed(engines: dict[str, EngineHandle], workloads: tuple[SpeedWorkload, ...], cfg: SpeedConfig,
                  device: str) -> tuple[SpeedTable, TimedOutputs]:
    """engines: name -> handle (candidate, parent, vanilla); the rotation starts with the first. The engine
    processes share one CPU while they are timed (seis.engine_host.affinity says why), and only then: the
    warm-ups run first, unpinned, because first calls compile kernels (FlashInfer's JIT starts nvcc and ninja,
    which would inherit a one-CPU mask and compile many times slower). The engines' processes are listed and pinned
    after the warm-ups, every engine frozen meanwhile, so what an engine started during them is pinned too, and
    nothing is started between the listing and the pin; the sandbox keeps an engine from widening its mask again."""
    idle = GpuIdle(device)
    _warm_up(engines, workloads, idle)
    with pinned_frozen(list(engines.values()), lambda: [pid for h in engines.values() for pid in h.pids()]) as cpu:
        table, timed = _measure(engines, workloads, cfg, device, idle)
    return table.model_copy(update={"pinned_cpu": cpu, "prompt_nonce": workloads[0].nonce if workloads else "",
                                    "gpu_idle_waits": idle.waits,
                                    "gpu_idle_wait_s": round(idle.waited_s, 3),
                                    "gpu_never_idle": idle.never_idle}), timed


def _warm_up(engines: dict[str, EngineHandle], workloads: tuple[SpeedWorkload, ...], idle: GpuIdle) -> None:
    """Every workload's untimed prompts on every engine, one engine at a time as when timed."""
    for wl in workloads:
        for prompts, sampling in _calls(wl.warmup, wl.batch):
            for name, engine in engines.items():
                if engine.usable:
                    _timed_call(engine, [e for n, e in engines.items() if n != name], idle, prompts, sampling)


def _measure(engines: dict[str, EngineHandle], workloads: tuple[SpeedWorkload, ...], cfg: SpeedConfig,
             device: str, idle: GpuIdle) -> tuple[SpeedTable, TimedOutputs]:
    rows: list[SpeedRow] = []
    names = list(engines)
    timed = TimedOutputs()
    for wl in workloads:
        passes: dict[str, list[list[Timing]]] = {n: [] for n in names}  # per repetition, per request
        outs: dict[str, list[list[GenerationOut | None]]] = {n: [] for n in names}
        failed: dict[str, str] = {}
        for rep, prompts in enumerate(wl.passes):
            for n in names:
                passes[n].append([])
                outs[n].append([])
            for i, (call_prompts, sampling) in enumerate(_calls(prompts, wl.batch)):
                k = (rep + i) % len(names)
                for name in names[k:] + names[:k]:
                    if name in failed:
                        outs[name][-1].extend([None] * len(call_prompts))
                        continue
                    engine = engines[name]
                    others = [e for n, e in engines.items() if n != name]
                    timing, out = _timed_call(engine, others, idle, call_prompts, sampling) if engine.running() \
                        else (None, None)
                    outs[name][-1].extend(out if out is not None else [None] * len(call_prompts))
                    if timing is None:
                        failed[name] = str(engine.failures[-1]) if engine.failures else "engine not usable"
                        continue
                    passes[name][-1].append(timing)
        timed.sets[wl.name] = list(wl.passes)
        timed.outputs[wl.name] = outs
        rows += _rows(wl.name, names, passes, failed)
    infos = [SpeedWorkloadInfo(name=w.name, n_prompts=w.n_prompts, ignore_eos=w.sampling.ignore_eos,
                               max_new_tokens=w.sampling.max_new_tokens, workload_digest=w.workload_digest,
                               batch=w.batch)
             for w in workloads if w.n_prompts]
    return SpeedTable(device=device, reps=cfg.reps, method=METHOD, workloads=infos, rows=rows), timed


def _rows(workload: str, names: list[str], passes: dict[str, list[list[Timing]]],
          failed: dict[str, str]) -> list[SpeedRow]:
    ok = {n for n in names if n not in failed and passes[n] and all(passes[n])}
    rows = []
    for name in names:
        good = name in ok
        tps = [_pass_tok_per_s(p) for p in passes[name]] if good else []
        lat = [statistics.median(s for _, s in p) * 1e3 for p in passes[name]] if good else []
        toks = [sum(t for t, _ in p) for p in passes[name]] if good else []
        rows.append(SpeedRow(
            workload=workload, engine=name, tokens_per_pass=statistics.median(toks) if toks else 0.0,
            tok_per_s=SpeedStat.of(tps) if good else None, latency_ms=SpeedStat.of(lat) if good else None,
            vs_parent=(_paired_ratio(passes[name], passes["parent"])
                       if good and name != "parent" and "parent" in ok else None),
            vs_vanilla=(_paired_ratio(passes[name], passes["vanilla"])
                        if good and name != "vanilla" and "vanilla" in ok else None),
            error=failed.get(name)))
    return rows


def vanilla_as_parent(table: SpeedTable) -> SpeedTable:
    """The table of a gate whose parent is vanilla's exact tree, timed as vanilla alone: each vanilla row stands for
    the parent too (the same engine in the same run, so the ratio between them is 1), and the candidate's ratio over
    its parent is its ratio over vanilla."""
    rows: list[SpeedRow] = []
    for row in table.rows:
        if row.engine == "candidate":
            rows.append(row.model_copy(update={"vs_parent": row.vs_vanilla}))
        elif row.engine == "vanilla":
            same = 1.0 if row.tok_per_s is not None else None
            rows += [row.model_copy(update={"engine": "parent", "vs_vanilla": same}),
                     row.model_copy(update={"vs_parent": same})]
        else:
            rows.append(row)
    return table.model_copy(update={"rows": rows, "parent_is_vanilla": True})
