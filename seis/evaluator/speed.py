"""Speed on the dev workloads: one request at a time, prefill included, engines interleaved per request.

Each prompt is run by every engine back to back, the order rotating from prompt to prompt and repetition to
repetition (A B C, B C A, C A B, ...), so drift of the machine (clocks, other load) within a pass hits all engines
alike. The ratios are medians of per-request paired throughput ratios (same prompt, seconds apart), so one slow
request or one slow pass moves them little. Times are taken in the gate process around each request: prefill +
decode + a JSON round trip well under a millisecond, the same for every engine.
"""
from __future__ import annotations

import statistics
import time

from ..benchmarks.stats import summarize
from ..engine_host.affinity import pinned_together
from .config import SpeedConfig
from .engines import EngineHandle
from .schema import SpeedRow, SpeedStat, SpeedTable, SpeedWorkloadInfo
from .workloads import SpeedWorkload

METHOD = ("single request at a time over the dev prompts, greedy; engines interleaved per request in rotating "
          "order; tok/s = generated tokens / summed request wall time of a pass; latency = median request wall "
          "time of a pass; median (min-max) over repetitions; ratios = median over requests x repetitions of "
          "paired per-request tok/s ratios")

Timing = tuple[int, float]  # generated tokens, wall seconds of one request


def _one_request(engine: EngineHandle, prompt: list[int], sampling) -> Timing | None:
    t0 = time.perf_counter()
    out = engine.generate([prompt], [sampling])
    elapsed = time.perf_counter() - t0
    return (len(out[0].token_ids), elapsed) if out else None


def _warm_up(engines: dict[str, EngineHandle], wl: SpeedWorkload, n: int) -> None:
    for prompt, sampling in list(zip(wl.prompts.prompt_lists(), wl.prompts.sampling))[:n]:
        for engine in engines.values():
            if engine.usable:
                _one_request(engine, prompt, sampling)


def _stat(values: list[float]) -> SpeedStat:
    return SpeedStat(**summarize(values))


def _paired_ratio(a: list[list[Timing]], b: list[list[Timing]]) -> float:
    """Median over (repetition, request) of tok/s(a) / tok/s(b) for the same request."""
    return statistics.median((ta[0] / ta[1]) / (tb[0] / tb[1]) for ra, rb in zip(a, b, strict=True)
                             for ta, tb in zip(ra, rb, strict=True) if ta[0] and tb[0])


def measure_speed(engines: dict[str, EngineHandle], workloads: tuple[SpeedWorkload, ...], cfg: SpeedConfig,
                  device: str) -> SpeedTable:
    """engines: name -> handle (candidate, parent, vanilla); the rotation starts with the first. The engine
    processes share one CPU while they are timed (seis.engine_host.affinity says why)."""
    pids = [h.pid for h in engines.values() if h.pid is not None]
    with pinned_together(pids) as cpu:
        table = _measure(engines, workloads, cfg, device)
    return table.model_copy(update={"pinned_cpu": cpu})


def _measure(engines: dict[str, EngineHandle], workloads: tuple[SpeedWorkload, ...], cfg: SpeedConfig,
             device: str) -> SpeedTable:
    rows: list[SpeedRow] = []
    names = list(engines)
    for wl in workloads:
        _warm_up(engines, wl, cfg.warmup_requests)
        requests = list(zip(wl.prompts.prompt_lists(), wl.prompts.sampling))
        passes: dict[str, list[list[Timing]]] = {n: [] for n in names}  # per repetition, per request
        failed: dict[str, str] = {}
        for rep in range(cfg.reps):
            for n in names:
                passes[n].append([])
            for i, (prompt, sampling) in enumerate(requests):
                k = (rep + i) % len(names)
                for name in names[k:] + names[:k]:
                    if name in failed:
                        continue
                    engine = engines[name]
                    timing = _one_request(engine, prompt, sampling) if engine.usable else None
                    if timing is None:
                        failed[name] = str(engine.failures[-1]) if engine.failures else "engine not usable"
                        continue
                    passes[name][-1].append(timing)
        ok = {n for n in names if n not in failed and passes[n] and all(passes[n])}
        for name in names:
            good = name in ok
            tps = [sum(t for t, _ in p) / sum(s for _, s in p) for p in passes[name]] if good else []
            lat = [statistics.median(s for _, s in p) * 1e3 for p in passes[name]] if good else []
            toks = [sum(t for t, _ in p) for p in passes[name]] if good else []
            rows.append(SpeedRow(
                workload=wl.name, engine=name, tokens_per_pass=statistics.median(toks) if toks else 0.0,
                tok_per_s=_stat(tps) if good else None, latency_ms=_stat(lat) if good else None,
                vs_parent=(_paired_ratio(passes[name], passes["parent"])
                           if good and name != "parent" and "parent" in ok else None),
                vs_vanilla=(_paired_ratio(passes[name], passes["vanilla"])
                            if good and name != "vanilla" and "vanilla" in ok else None),
                error=failed.get(name)))
    infos = [SpeedWorkloadInfo(name=w.name, n_prompts=len(w.prompts), ignore_eos=w.prompts.sampling[0].ignore_eos,
                               max_new_tokens=w.prompts.sampling[0].max_new_tokens, workload_digest=w.workload_digest)
             for w in workloads if len(w.prompts)]
    return SpeedTable(device=device, reps=cfg.reps, method=METHOD, workloads=infos, rows=rows)
