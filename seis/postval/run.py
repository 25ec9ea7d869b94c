"""run_post_validation: the candidate and vanilla E0, each in its own sandboxed process, every measure, then files.

Every byte from an engine process is untrusted, so the engines run under the gate's rules:

1. accuracy: one process per engine, greedy, chat template, all prompts in one generate call (untimed, both
   engines at once); the accuracy prompts are the public questions as they are, so a candidate's correct answer
   counts only where vanilla, scoring its output teacher-forced, would have produced it (accuracy.unbacked_answers);
   these processes are then closed;
2. speed: fresh processes, built again (the extra build time is measured and noted), so no timed engine has
   seen the accuracy prompts; every repetition of every workload times prompts that process has not seen
   (plan.speed_plan), warm-up prompts are never timed, and while one engine is timed the other's sandbox is
   frozen; repetitions interleave, and the gate's timed checks judge every output the candidate produced while
   timed against vanilla's (speed.judge_timed, speed.timed_check);
3. results are assembled and written only after every engine process is closed (nothing of them left).
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine_host.affinity import pinned_frozen
from ..engine_host.attention import baseline_attention
from ..engine_host.gpu_idle import GpuIdle
from ..provenance import device_label, source_commit, weights_label
from ..tables import printable
from ..workspace.tree import scratch_dir
from .accuracy import (
    Output,
    bucket_accuracy,
    charge_unbacked,
    decode_outputs,
    fits,
    score_gsm8k,
    score_retrieval_items,
    summarize_accuracy,
    unbacked_answers,
)
from .bandwidth import EnergyMeter, bound_tok_per_s, kv_bytes_per_token, measure_bandwidth, weight_bytes_per_token
from .plan import Plan, TimedSet, prepare_plan, run_dtype, speed_plan
from .postval_config import PostValConfig
from .result import (
    ENGINES,
    AccuracySummary,
    BandwidthInfo,
    EngineInfo,
    EngineName,
    ItemOutcome,
    PostValResult,
    SpeedComparison,
    context_flag,
)
from .speed import (BoundFn, TimedRules, VanillaScorer, alone, compare, freeze, judge_timed, measure_pair,
                    ran_while_frozen, timed_rules, warm_up)

log = logging.getLogger(__name__)


def run_post_validation(config: PostValConfig) -> PostValResult:
    """Judge config.engine_dir against vanilla E0; writes postval.json, tables and figures to config.out_dir."""
    plan = prepare_plan(config)  # raises PostValError before any engine starts
    result = measure(plan)  # returns only once every engine process is gone
    write_outputs(result, config.out_dir)
    return result


def _stats_of(reply: Any) -> dict:
    """An engine's stats as data (the candidate may reply anything)."""
    stats = reply.get("stats") if isinstance(reply, dict) else None
    return stats if isinstance(stats, dict) else {}


def _int_stat(stats: dict, key: str, default: int) -> int:
    v = stats.get(key)
    return v if type(v) is int and v > 0 else default


@contextmanager
def engine_pair(plan: Plan, phase: str) -> Iterator[tuple[dict, dict, dict[EngineName, float]]]:
    """Both engines started and built at once (independent processes); yields (engines, build replies, seconds
    from start to built per engine). On exit both are closed: their whole sandboxes killed, nothing left.

    Compile caches (engine_host.jit_cache): vanilla keeps its own on this machine (the gate's, for the same
    tree); the candidate gets a copy of it for this phase only, so nothing it wrote in one phase reaches the next."""
    from ..engine_host import EngineProcess
    from ..engine_host.jit_cache import held_cache, seeded_cache
    from ..evaluator.snapshot import tree_sha256

    c = plan.config
    opts, env = plan.engine_options(), c.engine_env()
    dirs = {"candidate": c.engine_dir, "vanilla": c.vanilla_dir}
    engines: dict[EngineName, EngineProcess] = {}
    with ExitStack() as stack:
        tree = tree_sha256(c.vanilla_dir)
        own = stack.enter_context(scratch_dir(f"seis-postval-{phase}-"))  # the candidate writes its cache here
        caches = {"candidate": seeded_cache(own / "cache", tree),  # before vanilla holds the cache it copies
                  "vanilla": stack.enter_context(held_cache(tree, own / "vanilla-cache"))}
        t0 = time.perf_counter()
        for n in ENGINES:
            engines[n] = stack.enter_context(EngineProcess(dirs[n], plan.model_dir, opts, c.timeout_s, env,
                                                           cache_dir=caches[n]))

        def build(n: EngineName) -> tuple[Any, float]:
            reply = engines[n].build()
            return reply, time.perf_counter() - t0

        with ThreadPoolExecutor(2) as pool:
            done = dict(zip(ENGINES, pool.map(build, ENGINES), strict=True))
        built = {n: done[n][0] for n in ENGINES}
        build_s = {n: done[n][1] for n in ENGINES}
        log.info("%s engines built in %.1f s", phase, max(build_s.values()))
        yield engines, built, build_s
    left = {n: e.pids() for n, e in engines.items() if e.pids()}
    if left:  # close() returns only once the sandbox is empty; checked again before anything is written
        raise RuntimeError(f"engine processes still running after close: {left}")


@dataclass
class _Gathered:
    """What the phases of one post-validation gather, engine by engine and phase by phase; turned into the result
    (_assemble) only once every engine process is gone."""
    plan: Plan
    started: dt.datetime = field(init=False, default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    t0: float = field(init=False, default_factory=time.perf_counter)
    opts: dict = field(init=False)
    notes: list[str] = field(init=False)
    info: dict[EngineName, EngineInfo] = field(init=False)
    device: str = field(init=False)  # the configured one until vanilla reports its own
    contexts: list[int] = field(default_factory=list)  # each phase's context: the smaller engine's max_seq_len
    vanilla_contexts: list[int] = field(default_factory=list)  # each phase's: vanilla's alone (trusted)
    items: list[ItemOutcome] = field(default_factory=list)
    accuracy: list[AccuracySummary] = field(default_factory=list)
    buckets: list = field(default_factory=list)
    speed: list[SpeedComparison] = field(default_factory=list)
    workloads: list[SpeedComparison] = field(default_factory=list)
    bandwidth: BandwidthInfo | None = None
    meter: EnergyMeter | None = None
    pools: list = field(default_factory=list)

    def __post_init__(self) -> None:
        c = self.plan.config
        self.opts = self.plan.engine_options()
        self.notes = list(self.plan.notes)
        self.info = {n: EngineInfo(engine_dir=str(d), stats={}) for n, d in (("candidate", c.engine_dir),
                                                                               ("vanilla", c.vanilla_dir))}
        self.device = c.device

    def record_build(self, phase: str, built: dict, build_s: dict[EngineName, float]) -> int:
        """A phase's engines are built: their build time and first stats; returns the phase's context. The first
        phase also fixes the device (vanilla's word: the candidate's is untrusted) and its notes."""
        c = self.plan.config
        for n in ENGINES:
            self.info[n].build_s[phase] = round(build_s[n], 2)
            if not self.info[n].stats:
                self.info[n].stats = _stats_of(built[n])
        stats = {n: _stats_of(built[n]) for n in ENGINES}
        context = min(_int_stat(stats[n], "max_seq_len", self.opts["max_seq_len"]) for n in ENGINES)
        self.contexts.append(context)
        self.vanilla_contexts.append(_int_stat(stats["vanilla"], "max_seq_len", self.opts["max_seq_len"]))
        if len(self.contexts) == 1:
            self.device = str(stats["vanilla"].get("device", c.device))
            if self.device == "cpu" and c.cpu_threads is None:
                self.notes.append("CPU engines run multi-threaded: their timings swing with any other load on the "
                                  "machine; --cpu-threads 1 gives steadier ratios")
            baseline = baseline_attention(stats["vanilla"], self.device)
            if baseline:
                self.notes.append(baseline)
        log.info("%s engines built on %s, context %d", phase, self.device, context)
        return context

    def record_after(self, engines: dict) -> None:
        """The engines' last stats, before their phase closes them."""
        for n in ENGINES:
            self.info[n].stats = {**self.info[n].stats, "after": _stats_of({"stats": engines[n].stats()})}


def measure(plan: Plan) -> PostValResult:
    c = plan.config
    run = _Gathered(plan)
    # 1. accuracy: its own processes, closed before anything is timed
    if plan.gsm8k_items or plan.retrieval_items:
        _accuracy_phase(plan, run)
    # 2. speed: fresh processes; each timed prompt new to its process; one engine running at a time
    if c.speed_requests or plan.dev or plan.heldout:
        _speed_phase(plan, run)
    # 3. every engine process is gone: only now is anything assembled (and later written)
    return _assemble(plan, run)


def _accuracy_phase(plan: Plan, run: _Gathered) -> None:
    """Both engines answer every accuracy prompt (GSM8K, retrieval); the items are scored and summarized."""
    with engine_pair(plan, "accuracy") as (engines, built, build_s):
        context = run.record_build("accuracy", built, build_s)
        eos_ids = _stop_scale(plan, built["vanilla"])[0] if plan.gsm8k_items or plan.retrieval_items else []
        if plan.gsm8k_items:
            run.items += _accuracy_task(plan, run, engines, context, "gsm8k", plan.gsm8k_items, plan.gsm8k_prompts,
                                        plan.gsm8k_max_new_tokens, score_gsm8k, eos_ids)
        if plan.retrieval_items:
            ret = _accuracy_task(plan, run, engines, context, "retrieval", plan.retrieval_items,
                                 plan.retrieval_prompts, plan.retrieval_max_new_tokens, score_retrieval_items, eos_ids)
            run.items += ret
            run.buckets = bucket_accuracy(plan.retrieval_items, ret)
        run.record_after(engines)


def _accuracy_task(plan: Plan, run: _Gathered, engines: dict, context: int, name: str, all_items: list,
                   all_prompts: list[list[int]], max_new: int, score, eos_ids: list[int]) -> list:
    """All prompts of a task in one call per engine; prompts over the context are skipped, counted. The
    candidate's correct answers that its model did not produce (vanilla scoring them) are counted wrong."""
    c = plan.config
    keep = [i for i, p in enumerate(all_prompts) if fits(p, context)]
    its, prompts = [all_items[i] for i in keep], [all_prompts[i] for i in keep]
    outs = _answer(plan, engines, prompts, max_new) if prompts else {n: [] for n in ENGINES}
    cand = score("candidate", its, prompts, outs["candidate"])
    unbacked = unbacked_answers(VanillaScorer(engines["vanilla"]), prompts, outs["candidate"], outs["vanilla"],
                                [o.correct for o in cand], c.timed_margin, c.timed_min_valid, max_new, context,
                                eos_ids)
    scored = charge_unbacked(cand, unbacked) + score("vanilla", its, prompts, outs["vanilla"])
    skipped = len(all_items) - len(keep)
    run.accuracy.append(summarize_accuracy(name, scored, skipped, plan.config.flag_points))
    log.info("%s: %d items answered by both engines (%.0f s so far)", name, len(prompts), time.perf_counter() - run.t0)
    if skipped:
        run.notes.append(f"{name}: {skipped} of {len(all_items)} prompts exceed the context ({context} tokens) and "
                         f"were skipped")
    return scored


def _answer(plan: Plan, engines: dict, prompts: list[list[int]], max_new: int) -> dict[EngineName, list[Output]]:
    """Greedy, EOS on, every prompt in one generate call per engine; untimed, so both engines work at once."""
    from ..engine_host.client import Sampling

    s = Sampling(max_new_tokens=max_new)
    with ThreadPoolExecutor(2) as pool:
        raw = dict(zip(ENGINES, pool.map(lambda n: engines[n].generate(prompts, s), ENGINES), strict=True))
    return {n: _decoded(plan, engines[n], raw[n], len(prompts)) for n in ENGINES}


def _speed_phase(plan: Plan, run: _Gathered) -> None:
    """Fresh engine processes (none saw an accuracy prompt) time the speed plan's sets under the gate's rules."""
    from ..engine_host.client import Sampling

    c = plan.config
    with engine_pair(plan, "speed") as (engines, built, build_s):
        context = run.record_build("speed", built, build_s)
        sp = speed_plan(plan, min(run.contexts))
        run.notes += sp.notes
        run.pools = sp.pools
        if "accuracy" in run.info["vanilla"].build_s:  # what the fresh processes cost on top of the first build
            acc = max(run.info[n].build_s["accuracy"] for n in ENGINES)
            run.notes.append(f"speed phase: fresh engine processes (none of them saw an accuracy prompt), started "
                             f"and built in {max(build_s.values()):.1f} s (candidate {build_s['candidate']:.1f} s, "
                             f"vanilla {build_s['vanilla']:.1f} s) on top of the accuracy phase's {acc:.1f} s")
        meter = run.meter = EnergyMeter(run.device)
        idle = GpuIdle(run.device)
        if sp.sets:
            run.bandwidth, bound = _bandwidth(plan, built, run.device, run.notes)
            rules = timed_rules(c, *_stop_scale(plan, built["vanilla"]), plan.vocab_size, context)
            timed, cpu = time_sets(engines, sp.speed + sp.workloads, Sampling, lambda ts: _time_set(
                engines, ts, meter, idle, bound, Sampling, rules))
            run.speed, run.workloads = timed[:len(sp.speed)], timed[len(sp.speed):]
            run.notes.append(f"timed engine processes shared CPU {cpu} (warm-ups ran unpinned)" if cpu is not None
                             else "engine processes could not be pinned to one CPU: timings more exposed to CPU "
                                  "placement")
            run.notes.append("while one engine was timed or warmed up, the other's whole sandbox was frozen (and on "
                             "a GPU, each timed pass started once the device was idle)")
        run.record_after(engines)


def _assemble(plan: Plan, run: _Gathered) -> PostValResult:
    """The result: what the phases gathered, the notes only the whole run can tell, and the flags."""
    c = plan.config
    context = min(run.contexts) if run.contexts else plan.context
    vanilla_context = min(run.vanilla_contexts) if run.vanilla_contexts else context
    meter = run.meter or EnergyMeter(run.device)
    notes = run.notes
    if any(plan.vocab_size <= t for s in plan.shapes for t in s.token_ids):
        notes.append(f"held-out shape token ids folded into the model's vocabulary ({plan.vocab_size})")
    for comp in run.speed + run.workloads:
        if comp.ignore_eos and comp.vanilla.output_lengths.min < comp.max_new_tokens:
            notes.append(f"{comp.workload}/{comp.mode}: some requests were cut at the context ({context} "
                         f"tokens) before {comp.max_new_tokens} new tokens")
    return PostValResult(
        config=c, model_dir=str(plan.model_dir), started_at=run.started.isoformat(timespec="seconds"),
        wall_s=time.perf_counter() - run.t0, context_tokens=context, engines=run.info, device=run.device,
        device_name=device_label(run.device), commit=source_commit(), weights=weights_label(c.model),
        accuracy=run.accuracy, retrieval_buckets=run.buckets, speed=run.speed, workloads=run.workloads,
        bandwidth=run.bandwidth, energy_available=meter.available, energy_note=meter.note,
        flags=_flags(c, run.accuracy, run.speed + run.workloads, context, vanilla_context), notes=notes,
        items=run.items, prompt_pools=run.pools, prompt_nonce=plan.prompt_nonce, vanilla_context_tokens=vanilla_context)


def _flags(c: PostValConfig, accuracy: list[AccuracySummary], comps: list[SpeedComparison], context: int,
           vanilla_context: int) -> list[str]:
    """Why a reader should not take the result at face value: a context the candidate's word cut below vanilla's,
    accuracy beyond the threshold, untrustworthy speed."""
    flags = [context_flag(context, vanilla_context)] if context < vanilla_context else []
    flags += [f"{a.task}: candidate {a.candidate_acc:.1f}% vs vanilla {a.vanilla_acc:.1f}% "
              f"({a.delta_points:+.1f} points, beyond ±{c.flag_points:g})" for a in accuracy if a.flagged]
    flags += [f"{a.task}: {a.unbacked} of the candidate's correct answers are outputs vanilla would not have "
              f"produced (teacher-forced, beyond the {c.timed_margin:g}-nat near-tie margin): counted wrong"
              for a in accuracy if a.unbacked]
    flags += [f"{comp.workload}/{comp.mode}: the candidate's timed outputs disagree with vanilla's "
              f"({'; '.join(comp.timed.reasons)}): its speed figure is not trustworthy"
              for comp in comps if comp.timed_flagged]
    return flags


def _decoded(plan: Plan, engine, raw: Any, n: int) -> list[Output]:
    """An accuracy reply, checked before decoding: one output per prompt, token ids in the vocabulary."""
    from ..engine_host import EngineError

    ok = isinstance(raw, list) and len(raw) == n and all(
        isinstance(r, dict) and isinstance(r.get("finish_reason"), str) and isinstance(r.get("token_ids"), list)
        and all(type(t) is int and 0 <= t < plan.vocab_size for t in r["token_ids"]) for r in raw)
    if not ok:
        raise EngineError(f"{engine.engine_dir}: malformed generate reply to {n} accuracy prompts "
                          f"(not one output of in-vocabulary token ids per prompt)")
    return decode_outputs(plan.tokenizer, raw)


def time_sets(engines, sets: list[TimedSet], sampling_cls: type, time_one: Callable[[TimedSet], SpeedComparison]
              ) -> tuple[list[SpeedComparison], int | None]:
    """Warm both engines up on every set's untimed prompts (one engine at a time), unpinned: first calls compile
    kernels, and FlashInfer's nvcc and ninja would inherit a one-CPU mask. Then time each set with every engine
    thread on one shared CPU (engine_host.affinity says why), listed and pinned with both sandboxes frozen, so what
    an engine started during the warm-ups is pinned too; returns the comparisons and that CPU."""
    for ts in sets:
        warm = [list(p.tokens) for p in ts.warmup]
        for n in ENGINES:
            with alone(engines, n):
                warm_up(engines[n], warm, sampling_cls)
    frozen = [_Sandbox(engines, n) for n in ENGINES if getattr(engines[n], "box", None) is not None]
    with pinned_frozen(frozen, lambda: [pid for n in ENGINES for pid in engines[n].pids()]) as cpu:
        return [time_one(ts) for ts in sets], cpu


@dataclass
class _Sandbox:
    """One engine's sandbox as pinned_frozen freezes and thaws it: one that resists its freeze or ran while frozen
    fails as in alone()."""
    engines: Any
    name: str

    def freeze(self) -> None:
        freeze(self.engines, self.name)

    def thaw(self) -> None:
        if self.engines[self.name].box.thaw():
            ran_while_frozen(self.engines, [self.name])


def _time_set(engines, ts: TimedSet, meter: EnergyMeter, idle: GpuIdle, bound: BoundFn | None,
              sampling_cls: type, rules: TimedRules) -> SpeedComparison:
    """A warmed-up set's interleaved repetitions; then the gate's timed checks judge the candidate's timed outputs,
    vanilla scoring them."""
    sampling = sampling_cls(max_new_tokens=ts.max_new_tokens, ignore_eos=ts.ignore_eos)
    log.info("timing %s (%s), %d requests x %d reps", ts.workload, ts.mode, ts.requests, len(ts.reps))
    busy_before = idle.never_idle
    prompts = [[list(p.tokens) for p in rep] for rep in ts.reps]
    timings = measure_pair(engines, prompts, sampling, ts.mode, meter, idle)
    busy = idle.never_idle - busy_before
    checks = judge_timed(VanillaScorer(engines["vanilla"]), ts.workload, prompts, sampling, timings, rules)
    return compare(ts, sampling, timings, checks, bound).model_copy(update={"gpu_busy_passes": busy})


def _stop_scale(plan: Plan, vanilla_built: Any) -> tuple[list[int], float]:
    """Vanilla's EOS ids (its build reply: vanilla is trusted) and how much more rounding moves an EOS-vs-top-1 gap
    than an ordinary near-tie in this model (evaluator.logit_scale), for the stop margin."""
    from ..engine_host import EngineError
    from ..evaluator.logit_scale import eos_gap_scale

    ids = vanilla_built.get("eos_token_ids") if isinstance(vanilla_built, dict) else None
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise EngineError(f"vanilla's build reply has no list of EOS ids: {str(vanilla_built)[:200]}")
    return ids, eos_gap_scale(plan.model_dir, ids)


def _bandwidth(plan: Plan, built: dict, device: str, notes: list[str]) -> tuple[BandwidthInfo | None, BoundFn | None]:
    """Bytes/s (configured or measured) and the per-engine bound at each engine's run dtype."""
    c = plan.config
    try:
        if c.bandwidth_gbs is not None:
            bps, source = c.bandwidth_gbs * 1e9, "configured"
        else:
            bps, source = measure_bandwidth(device)
        # the dtype both engines were asked for, not the one an engine's stats claim: a candidate saying float32
        # while running bf16 halved its own bound (and doubled its share of it), and a dtype no table knows took
        # the bound away from both engines
        asked = run_dtype(c.dtype, device)
        dtypes = {n: asked for n in ENGINES}
        for n in ENGINES:
            said = _stats_of(built[n]).get("dtype")
            if said is not None and str(said).removeprefix("torch.") != asked:
                notes.append(f"{n} says it runs {printable(str(said))[:40]}, asked {asked}: its bound is {asked}'s")
        weights = {n: weight_bytes_per_token(plan.model_dir, asked) for n in ENGINES}
        kv = {n: kv_bytes_per_token(plan.model_dir, asked) for n in ENGINES}
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
