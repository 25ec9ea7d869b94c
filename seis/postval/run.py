"""run_post_validation: both engines built once in their own processes, every measure, then files.

The candidate and vanilla E0 get the same model, options and prompts; accuracy runs greedy with the chat
template and all prompts in one generate call (the engine batches them); speed repetitions interleave.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from ..engine_host.affinity import pinned_together
from .accuracy import (
    bucket_accuracy,
    decode_outputs,
    fits,
    score_gsm8k,
    score_retrieval_items,
    summarize_accuracy,
)
from .bandwidth import EnergyMeter, bound_tok_per_s, kv_bytes_per_token, measure_bandwidth, weight_bytes_per_token
from .config import PostValConfig
from .plan import Plan, Workload, prepare_plan
from .result import (
    ENGINES,
    AccuracySummary,
    BandwidthInfo,
    EngineInfo,
    EngineName,
    ItemOutcome,
    PostValResult,
    SpeedComparison,
)
from .speed import BoundFn, compare, measure_pair, warm_up

log = logging.getLogger(__name__)


def run_post_validation(config: PostValConfig) -> PostValResult:
    """Judge config.engine_dir against vanilla E0; writes postval.json, tables and figures to config.out_dir."""
    plan = prepare_plan(config)  # raises PostValError before any engine starts
    result = measure(plan)
    write_outputs(result, config.out_dir)
    return result


def measure(plan: Plan) -> PostValResult:
    from ..engine_host import EngineProcess
    from ..engine_host.client import Sampling

    c = plan.config
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    notes: list[str] = list(plan.notes)
    opts, env = plan.engine_options(), c.engine_env()
    with ExitStack() as stack:
        engines: dict[EngineName, EngineProcess] = {
            "candidate": stack.enter_context(EngineProcess(c.engine_dir, plan.model_dir, opts, c.timeout_s, env)),
            "vanilla": stack.enter_context(EngineProcess(c.vanilla_dir, plan.model_dir, opts, c.timeout_s, env)),
        }
        with ThreadPoolExecutor(2) as pool:  # independent processes: build both at once
            built = dict(zip(ENGINES, pool.map(lambda n: engines[n].build(), ENGINES), strict=True))
        info = {n: EngineInfo(engine_dir=str(engines[n].engine_dir), stats=built[n]["stats"]) for n in ENGINES}
        context = min(int(built[n]["stats"].get("max_seq_len", opts["max_seq_len"])) for n in ENGINES)
        device = str(built["vanilla"]["stats"].get("device", c.device))
        if device == "cpu" and c.cpu_threads is None:
            notes.append("CPU engines run multi-threaded: their timings swing with any other load on the machine; "
                         "--cpu-threads 1 gives steadier ratios")
        log.info("engines built on %s, context %d", device, context)

        items: list[ItemOutcome] = []
        accuracy: list[AccuracySummary] = []

        def answer(prompts: list[list[int]], max_new: int) -> dict[EngineName, list]:
            s = Sampling(max_new_tokens=max_new)  # greedy, EOS on
            with ThreadPoolExecutor(2) as pool:  # untimed: both engines work at once
                raw = dict(zip(ENGINES, pool.map(lambda n: engines[n].generate(prompts, s), ENGINES), strict=True))
            return {n: decode_outputs(plan.tokenizer, raw[n]) for n in ENGINES}

        def task(name: str, all_items: list, all_prompts: list[list[int]], max_new: int, score) -> list:
            """All prompts of a task in one call per engine; prompts over the context are skipped and counted."""
            keep = [i for i, p in enumerate(all_prompts) if fits(p, context)]
            its, prompts = [all_items[i] for i in keep], [all_prompts[i] for i in keep]
            outs = answer(prompts, max_new) if prompts else {n: [] for n in ENGINES}
            scored = [o for n in ENGINES for o in score(n, its, prompts, outs[n])]
            skipped = len(all_items) - len(keep)
            accuracy.append(summarize_accuracy(name, scored, skipped, c.flag_points))
            log.info("%s: %d items answered by both engines (%.0f s so far)", name, len(prompts),
                     time.perf_counter() - t0)
            if skipped:
                notes.append(f"{name}: {skipped} of {len(all_items)} prompts exceed the context "
                             f"({context} tokens) and were skipped")
            return scored

        if plan.gsm8k_items:
            items += task("gsm8k", plan.gsm8k_items, plan.gsm8k_prompts, plan.gsm8k_max_new_tokens, score_gsm8k)
        buckets = []
        if plan.retrieval_items:
            ret = task("retrieval", plan.retrieval_items, plan.retrieval_prompts, plan.retrieval_max_new_tokens,
                       score_retrieval_items)
            items += ret
            buckets = bucket_accuracy(plan.retrieval_items, ret)

        # Speed: bandwidth bound and energy meter first, then interleaved repetitions.
        meter = EnergyMeter(device)
        speed_prompts = [p for p in plan.speed_prompts if fits(p, context)]
        bandwidth, bound = (_bandwidth(plan, built, device, notes) if speed_prompts or plan.dev or plan.heldout
                            else (None, None))
        speed: list[SpeedComparison] = []
        if speed_prompts or plan.dev or plan.heldout:  # one shared CPU for all timings (see engine_host.affinity)
            cpu = stack.enter_context(pinned_together([engines[n].proc.pid for n in ENGINES]))
            notes.append(f"timed engine processes shared CPU {cpu}" if cpu is not None else
                         "engine processes could not be pinned to one CPU: timings more exposed to CPU placement")
        if len(speed_prompts) < c.speed_requests:
            notes.append(f"speed: {len(speed_prompts)} of the requested {c.speed_requests} GSM8K prompts fit the "
                         f"context ({context} tokens)")
        if speed_prompts:
            natural = Workload(f"natural-{plan.natural_max_new_tokens}", "test", speed_prompts,
                               plan.natural_max_new_tokens, False)
            fixed = Workload(f"fixed-{plan.fixed_new_tokens}", "test", speed_prompts, plan.fixed_new_tokens, True)
            speed += _time_workload(engines, natural, {"single": None, "batch": None}, c.reps, meter, bound, Sampling)
            modes = {"single": c.fixed_single_requests, "batch": None} if c.fixed_single_requests else {"batch": None}
            speed += _time_workload(engines, fixed, modes, c.reps, meter, bound, Sampling)
        workloads: list[SpeedComparison] = []
        for wl in plan.dev + plan.heldout:
            prompts = [p for p in wl.prompts if len(p) + (wl.max_new_tokens if wl.kind == "heldout" else 0)
                       <= context and fits(p, context)]
            if not prompts:
                notes.append(f"{wl.name}: does not fit the context ({context} tokens); skipped")
                continue
            workloads += _time_workload(engines, Workload(wl.name, wl.kind, prompts, wl.max_new_tokens, wl.ignore_eos),
                                        {"single": None}, c.reps, meter, bound, Sampling)
        if any(plan.vocab_size <= t for s in plan.shapes for t in s.token_ids):
            notes.append(f"held-out shape token ids folded into the model's vocabulary ({plan.vocab_size})")
        for comp in speed + workloads:
            if comp.ignore_eos and comp.vanilla.output_lengths.min < comp.max_new_tokens:
                notes.append(f"{comp.workload}/{comp.mode}: some requests were cut at the context ({context} "
                             f"tokens) before {comp.max_new_tokens} new tokens")
            for m in (comp.candidate, comp.vanilla):
                if not m.deterministic:
                    notes.append(f"{comp.workload}/{comp.mode}: {m.engine} outputs differ between repetitions")
        final = {n: engines[n].stats() for n in ENGINES}
        for n in ENGINES:
            info[n].stats = {**info[n].stats, "after": final[n]}

    flags = [f"{a.task}: candidate {a.candidate_acc:.1f}% vs vanilla {a.vanilla_acc:.1f}% "
             f"({a.delta_points:+.1f} points, beyond ±{c.flag_points:g})" for a in accuracy if a.flagged]
    return PostValResult(
        config=c, model_dir=str(plan.model_dir), started_at=started.isoformat(timespec="seconds"),
        wall_s=time.perf_counter() - t0, context_tokens=context, engines=info, device=device, accuracy=accuracy,
        retrieval_buckets=buckets, speed=speed, workloads=workloads, bandwidth=bandwidth,
        energy_available=meter.available, energy_note=meter.note, flags=flags, notes=notes, items=items)


def _time_workload(engines, wl: Workload, modes: dict[str, int | None], reps: int, meter: EnergyMeter,
                   bound: BoundFn | None, sampling_cls: type) -> list[SpeedComparison]:
    """Each mode over the workload's first N prompts (None: all of them)."""
    sampling = sampling_cls(max_new_tokens=wl.max_new_tokens, ignore_eos=wl.ignore_eos)
    for n in ENGINES:
        warm_up(engines[n], wl.prompts, sampling_cls)
    out = []
    for mode, limit in modes.items():
        prompts = wl.prompts[:limit]
        log.info("timing %s (%s), %d requests x %d reps", wl.name, mode, len(prompts), reps)
        timings = measure_pair(engines, prompts, sampling, mode, reps, meter)
        out.append(compare(wl.name, wl.kind, mode, sampling, prompts, timings, bound))
    return out


def _bandwidth(plan: Plan, built: dict, device: str, notes: list[str]) -> tuple[BandwidthInfo | None, BoundFn | None]:
    """Bytes/s (configured or measured) and the per-engine bound at each engine's run dtype."""
    c = plan.config
    try:
        if c.bandwidth_gbs is not None:
            bps, source = c.bandwidth_gbs * 1e9, "configured"
        else:
            bps, source = measure_bandwidth(device)
        dtypes = {n: str(built[n]["stats"].get("dtype", "float32")) for n in ENGINES}
        weights = {n: weight_bytes_per_token(plan.model_dir, dtypes[n]) for n in ENGINES}
        kv = {n: kv_bytes_per_token(plan.model_dir, dtypes[n]) for n in ENGINES}
    except (RuntimeError, ValueError, OSError, KeyError) as exc:  # the bound is context, never a reason to fail
        notes.append(f"bandwidth bound unavailable: {exc}")
        return None, None
    info = BandwidthInfo(bytes_per_s=bps, source=source, weight_bytes=weights, kv_bytes_per_token=kv, dtype=dtypes)

    def bound(name: EngineName, mean_context: float) -> float:
        return bound_tok_per_s(bps, weights[name], kv[name], mean_context)

    return info, bound


def write_outputs(result: PostValResult, out_dir: str | Path) -> dict[str, str]:
    """postval.json, per-item outputs, tables (md + parquet) and figures (png); returns name -> path."""
    import pandas as pd

    from .figures import write_figures
    from .metrics import write_metrics
    from .tables import write_tables

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = write_tables(result, out) | write_metrics(result, out)
    items_path = out / "items.parquet"
    pd.DataFrame([i.model_dump() for i in result.items],
                 columns=list(ItemOutcome.model_fields)).to_parquet(items_path, index=False)
    files["items.parquet"] = str(items_path)
    if result.config.figures:
        files |= write_figures(result, out)
    files["postval.json"] = str(out / "postval.json")
    result.files = files
    (out / "postval.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")
    return files
