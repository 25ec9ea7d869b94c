"""Speed on the dev workloads: one request at a time, prefill included, engines interleaved.

Every repetition times each engine's full pass over the workload in turn (A B C A B C ...), so slow drift of the
machine (clocks, other load) hits all engines alike. Times are taken in the gate process around each request:
prefill + decode + a JSON round trip well under a millisecond, the same for every engine.
"""
from __future__ import annotations

import statistics
import time

from ..benchmarks.stats import summarize
from .config import SpeedConfig
from .engines import EngineHandle
from .schema import SpeedRow, SpeedStat, SpeedTable, SpeedWorkloadInfo
from .workloads import SpeedWorkload

METHOD = ("single request at a time over the dev prompts, greedy; tok/s = generated tokens / summed request "
          "wall time of a pass; latency = median request wall time of a pass; median (min-max) over interleaved "
          "repetitions; ratios are of median tok/s")


def _one_pass(engine: EngineHandle, wl: SpeedWorkload) -> tuple[int, list[float]] | None:
    tokens, latencies = 0, []
    for prompt, sampling in zip(wl.prompts.prompt_lists(), wl.prompts.sampling):
        t0 = time.perf_counter()
        out = engine.generate([prompt], [sampling])
        elapsed = time.perf_counter() - t0
        if not out:
            return None
        tokens += len(out[0].token_ids)
        latencies.append(elapsed)
    return tokens, latencies


def _stat(values: list[float]) -> SpeedStat:
    return SpeedStat(**summarize(values))


def measure_speed(engines: dict[str, EngineHandle], workloads: tuple[SpeedWorkload, ...], cfg: SpeedConfig,
                  device: str) -> SpeedTable:
    """engines: name -> handle, in interleaving order (candidate, parent, vanilla)."""
    rows: list[SpeedRow] = []
    for wl in workloads:
        warm = SpeedWorkload(wl.name, wl.workload_digest, wl.prompts.subset(list(range(
            min(cfg.warmup_requests, len(wl.prompts))))))
        for engine in engines.values():
            if len(warm.prompts):
                _one_pass(engine, warm)
        tps: dict[str, list[float]] = {n: [] for n in engines}
        lat: dict[str, list[float]] = {n: [] for n in engines}
        toks: dict[str, list[int]] = {n: [] for n in engines}
        failed: dict[str, str] = {}
        for _ in range(cfg.reps):
            for name, engine in engines.items():
                if name in failed:
                    continue
                result = _one_pass(engine, wl) if engine.usable else None
                if result is None:
                    failed[name] = str(engine.failures[-1]) if engine.failures else "engine not usable"
                    continue
                tokens, latencies = result
                tps[name].append(tokens / sum(latencies))
                lat[name].append(statistics.median(latencies) * 1e3)
                toks[name].append(tokens)
        med = {n: statistics.median(v) for n, v in tps.items() if v and n not in failed}
        for name in engines:
            ok = name in med
            rows.append(SpeedRow(
                workload=wl.name, engine=name,
                tokens_per_pass=statistics.median(toks[name]) if toks[name] else 0.0,
                tok_per_s=_stat(tps[name]) if ok else None, latency_ms=_stat(lat[name]) if ok else None,
                vs_parent=med[name] / med["parent"] if ok and name != "parent" and "parent" in med else None,
                vs_vanilla=med[name] / med["vanilla"] if ok and name != "vanilla" and "vanilla" in med else None,
                error=failed.get(name)))
    infos = [SpeedWorkloadInfo(name=w.name, n_prompts=len(w.prompts), ignore_eos=w.prompts.sampling[0].ignore_eos,
                               max_new_tokens=w.prompts.sampling[0].max_new_tokens, workload_digest=w.workload_digest)
             for w in workloads if len(w.prompts)]
    return SpeedTable(device=device, reps=cfg.reps, method=METHOD, workloads=infos, rows=rows)
