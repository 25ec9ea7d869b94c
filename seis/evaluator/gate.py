"""The development gate: snapshot and isolate the engines, check correctness against the reference, measure
speed, and return one validated GateResult. Also the dev benchmark agents may run (speed table only)."""
from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .correctness import run_correctness
from ..sandbox import SandboxError, interrupted
from .engines import Deadline, EngineHandle, start_and_build
from .errors import GateInputError, GateInterrupted, HostFailure, ReferenceEngineFailure, ReferenceFailure
from .gate_config import GateConfig, SpeedConfig
from .isolation import OFFLINE_ENV, VISIBLE, Isolation, make_isolation
from .logit_scale import eos_gap_scale
from .schema import Calibration, CheckResult, DevBenchmarkResult, GateResult, Hashes, IsolationRecord, SpeedTable
from .snapshot import Snapshot, files_sha256, snapshot, tree_sha256
from .speed import TimedOutputs, measure_speed, vanilla_as_parent
from .timed import timed_checks
from .workloads import GateWorkloads, SpeedWorkload, load_gate_workloads, load_speed_workloads, read_model_limits
from ..workspace.tree import TreeError, copy_tree, remove_tree, scratch_dir

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # seis/


def evaluator_source_sha256() -> str:
    """The code that judges: this package, the engine host and the engine importer."""
    files = [*sorted((PACKAGE_ROOT / "evaluator").glob("*.py")), *sorted((PACKAGE_ROOT / "engine_host").glob("*.py")),
             PACKAGE_ROOT / "engine_import.py", PACKAGE_ROOT / "workspace" / "tree.py"]  # tree.py: the tree hash
    return files_sha256(files, PACKAGE_ROOT.parent)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def resolve_device(name: str) -> str:
    from ..host import missing_device, runs_on_cuda
    why = missing_device(name)
    if why:
        raise GateInputError(f"--device {name} was requested but {why}")
    return "cuda" if runs_on_cuda(name) else "cpu"


def _resolve_model(name: str) -> Path:
    from ..models import ModelError, resolve_model
    try:
        return resolve_model(name)
    except ModelError as e:
        raise GateInputError(str(e)) from None


@dataclass(frozen=True)
class _Setup:
    model_dir: Path
    device: str
    isolation: Isolation
    snaps: dict[str, Snapshot]  # role -> private copy
    snapshot_ids: dict[str, str]  # role -> store id it was restored from
    cache_root: Path


def _restore(config: GateConfig, snapshot_id: str, dest: Path, what: str) -> Path:
    from ..store import SnapshotStore, StoreError, UnknownSnapshotError
    try:
        return SnapshotStore(config.store, use_dvc=None).get(snapshot_id, dest)
    except (StoreError, UnknownSnapshotError) as e:
        raise GateInputError(f"the {what} snapshot {snapshot_id} cannot be restored: {e}") from None


def _sources(config: GateConfig, tmp: Path, roles: dict[str, Path | None]) -> tuple[dict[str, Path], dict[str, str]]:
    """Each role's tree: the trusted ones from the snapshot store when the config names snapshots."""
    sources, ids = {r: p for r, p in roles.items() if p}, {}
    for role, sid in (("vanilla", config.reference_snapshot), ("parent", config.parent_snapshot)):
        if sid and role in roles:
            sources[role] = _restore(config, sid, tmp / "store" / role, "reference" if role == "vanilla" else role)
            ids[role] = sid
    return sources, ids


def _setup(config: GateConfig, tmp: Path, roles: dict[str, Path | None]) -> _Setup:
    """Everything that can be refused before an engine starts: model, device, sandbox, candidate trees."""
    limit = config.isolation.max_tree_mb * 2**20
    sources, ids = _sources(config, tmp, roles)
    snaps = {role: snapshot(src, tmp / role, what="reference" if role == "vanilla" else role, max_bytes=limit)
             for role, src in sources.items()}
    model_dir = _resolve_model(config.model)
    device = resolve_device(config.device)
    from ..workloads import WorkloadDataError, ensure_prepared
    try:
        ensure_prepared(config.prepared_dir)
    except WorkloadDataError as e:
        raise GateInputError(f"{e} (prepared workloads dir: {config.prepared_dir or 'data/prepared'})") from None
    return _Setup(model_dir, device, make_isolation(device, config.isolation), snaps, ids, tmp)


def _cache_dirs(setup: _Setup, roles: list[str], trusted: set[str], held: ExitStack) -> dict[str, Path]:
    """A trusted engine's JIT cache persists across gates, held while `held` lasts; an untrusted one's is private,
    seeded before the trusted one is held (engine_host.jit_cache)."""
    from ..engine_host.jit_cache import held_cache, seeded_cache
    ref = setup.snaps.get("vanilla")
    tree = ref.sha256 if ref else "none"
    own = {role: setup.cache_root / f"cache-{role}" for role in roles}
    dirs = {role: seeded_cache(own[role], tree) for role in roles if role not in trusted}
    return dirs | {role: held.enter_context(held_cache(tree, own[role])) for role in roles if role in trusted}


def _parent_is_vanilla(snaps: dict[str, Snapshot]) -> bool:
    """The parent's tree is vanilla's to the byte (session 0 of a chain, every branching session): one engine is
    built and timed for both, as a third would only repeat vanilla's numbers (and, on a GPU, its model load and graph
    capture)."""
    return "parent" in snaps and snaps["parent"].sha256 == snaps["vanilla"].sha256


def _handles(config: GateConfig, setup: _Setup, max_seq_len: int, trusted: set[str],
             held: ExitStack) -> dict[str, EngineHandle]:
    iso = config.isolation
    deadline = Deadline(iso.gate_timeout_s)
    options = {"device": setup.device, "dtype": "auto", "max_batch_size": config.max_batch_size,
               "max_seq_len": max_seq_len, "use_cuda_graphs": config.use_cuda_graphs, "seed": config.seed}
    roles = [r for r in setup.snaps if not (r == "parent" and _parent_is_vanilla(setup.snaps))]
    caches = _cache_dirs(setup, roles, trusted, held)
    handles = {}
    for role in roles:
        snap = setup.snaps[role]
        # Per-call limits are for untrusted code; the trusted reference is bounded by the gate's deadline alone.
        build_s, call_s = (iso.gate_timeout_s,) * 2 if role in trusted else (iso.build_timeout_s, iso.call_timeout_s)
        # The parent is untrusted and no party to the verdict: its calls take a budget of their own and are given
        # back to the gate's, else a parent answering each call just inside its limit ran the gate's budget out
        # under the candidate (its timeout) or the reference (engine.reference_alone), and the candidate failed.
        own = Deadline(iso.gate_timeout_s) if role == "parent" else deadline
        handles[role] = EngineHandle(role, snap.path, setup.model_dir, options, setup.isolation, own,
                                     build_s, call_s, trusted=role in trusted,
                                     cache_dir=caches[role],
                                     shared=deadline if role == "parent" else None)
    return handles


def _isolation_record(config: GateConfig, iso: Isolation) -> IsolationRecord:
    c = config.isolation
    return IsolationRecord(sandbox=iso.sandbox, visible_paths=list(VISIBLE), memory_limit=iso.memory_limit,
                           memory_limit_bytes=iso.memory_limit_bytes,
                           sandbox_memory_bytes=iso.sandbox_memory_bytes,
                           offline_env=dict(OFFLINE_ENV),
                           env_keys=iso.env_keys, build_timeout_s=c.build_timeout_s,
                           call_timeout_s=c.call_timeout_s, gate_timeout_s=c.gate_timeout_s)


def _engine_checks(cand: EngineHandle) -> list[CheckResult]:
    build_fail = [str(f) for f in cand.failures if f.op == "build"]
    timeouts = [str(f) for f in cand.failures if f.timeout]
    other = [str(f) for f in cand.failures if f.op != "build" and not f.timeout]
    return [
        CheckResult.bounded("engine.build", 1.0 if cand.build_info is not None else 0.0, lower=1.0,
                            detail=build_fail[0] if build_fail else "built"),
        CheckResult.bounded("engine.timeout", float(cand.timed_out), upper=0.0,
                            detail=timeouts[0] if timeouts else "every call answered in time"),
        _errors_check(cand, other),
    ]


def _errors_check(cand: EngineHandle, other: list[str]) -> CheckResult:
    """engine.errors, with how many calls of each kind failed in `extra` ('failed.<op>'): the detail quotes the
    engine's own messages, which agents are not shown (report.render_gate_for_agents); the counts they are."""
    check = CheckResult.rules("engine.errors", other, cand.calls)
    ops = Counter(f.op for f in cand.failures if f.op != "build" and not f.timeout)
    return check.model_copy(update={"extra": {**check.extra, **{f"failed.{op}": float(n) for op, n in ops.items()}}})


def _close(handles: dict[str, EngineHandle]) -> None:
    """End every engine's sandbox; each close returns only when no process of it is left."""
    errors = []
    for h in handles.values():
        try:
            h.close()
        except SandboxError as e:
            errors.append(f"{h.role}: {e}")
    if errors:  # a gate must not end while untrusted code still runs
        raise ReferenceFailure("engine processes survived the gate: " + "; ".join(errors))


def _unchanged(snaps: dict[str, Snapshot]) -> tuple[bool, list[CheckResult]]:
    """Hash every private copy again now that no engine runs: the trusted ones must not have changed (else the
    gate has no verdict), the candidate's change is a failed check."""
    changed = {role for role, snap in snaps.items() if tree_sha256(snap.path) != snap.sha256}
    trusted = changed - {"candidate"}
    if trusted:
        raise ReferenceFailure(f"the {', '.join(sorted(trusted))} tree changed during the gate")
    check = CheckResult.bounded("engine.tree_unchanged", 0.0 if "candidate" in changed else 1.0, lower=1.0,
                                detail="the candidate's copy changed while it ran" if changed else
                                "every engine tree hashed the same before and after")
    return not changed, [check]


def _retain(snap: Snapshot, dest: Path) -> None:
    """Copy exactly the judged tree to dest, and prove it is that tree."""
    remove_tree(dest)  # what an earlier attempt retained there
    try:
        copy_tree(snap.path, dest)  # through descriptors, modes made safe: the tree is still the agent's
    except TreeError as e:
        raise ReferenceFailure(f"the judged tree could not be copied to {dest}: {e}") from None
    if tree_sha256(dest) != snap.sha256:
        raise ReferenceFailure(f"the retained copy in {dest} does not hash as the judged tree")


def run_gate(config: GateConfig) -> GateResult:
    """Judge config.candidate against the reference. Raises GateInputError for bad input and ReferenceFailure if
    the reference itself breaks; anything the candidate does wrong ends up as a failed check instead. The
    result is built only after every engine process is gone."""
    # milliseconds: a run's timeline orders its gates by this
    t0, started = time.monotonic(), datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    timings: dict[str, float] = {}
    # scratch_dir: the candidate writes into its cache under tmp; whatever it leaves there (links, a chain
    # thousands deep) is removed without following a link or recursing, so the verdict always comes back
    with scratch_dir("seis-gate-") as tmp, ExitStack() as held:
        roles = {"candidate": config.candidate, "vanilla": config.reference,
                 "parent": config.parent if config.speed.enabled else None}
        setup = _setup(config, tmp, roles)
        wl = load_gate_workloads(config, setup.model_dir)
        vocab, _ = read_model_limits(setup.model_dir)
        timings["setup"] = time.monotonic() - t0
        handles = _handles(config, setup, wl.budget.max_seq_len, trusted={"vanilla"}, held=held)
        failed_beside: ReferenceEngineFailure | None = None
        try:
            judged = _judge(config, setup, wl, handles, vocab, timings)
        except (ReferenceFailure, HostFailure, SandboxError) as e:
            if interrupted():
                raise GateInterrupted("the run was interrupted while the gate ran") from e
            if not isinstance(e, ReferenceEngineFailure) or len(handles) == 1:
                raise
            failed_beside = e
        finally:
            _close(handles)
        if failed_beside is not None:
            judged = _reference_alone(handles["vanilla"], failed_beside, timings)
        if interrupted():  # its engines were killed under it: whatever failed, the candidate is not to blame
            raise GateInterrupted("the run was interrupted while the gate ran")
        result = _gate_result(config, setup, wl, handles["candidate"], judged, timings, started, t0)
        if result.verdict == "pass" and config.retain_dir is not None:
            _retain(setup.snaps["candidate"], config.retain_dir)
        return result


@contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    """timings[phase]: the seconds the block took (not recorded when it raises)."""
    mark = time.monotonic()
    yield
    timings[phase] = time.monotonic() - mark


@dataclass
class _Judged:
    """What the gate learnt while the engines ran: the candidate's correctness and speed checks (the engine and
    tree checks come once every engine is closed), the calibration, the speed table, counts and engine stats."""
    checks: list[CheckResult] = field(default_factory=list)
    calibration: Calibration | None = None
    speed: SpeedTable | None = None
    counts: dict[str, int] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


def _judge(config: GateConfig, setup: _Setup, wl: GateWorkloads, handles: dict[str, EngineHandle], vocab: int,
           timings: dict[str, float]) -> _Judged:
    """Build every engine; check correctness if the candidate built; then time it, if speed is on and it is still
    correct (or config.speed.run_on_fail), judging its timed outputs too."""
    cand, ref = handles["candidate"], handles["vanilla"]
    judged = _Judged()
    with _timed(timings, "build"):
        start_and_build(list(handles.values()))
    if cand.running():
        with _timed(timings, "correctness"):
            outcome = run_correctness(ref, cand, wl, config, ref.build_info.eos_token_ids, vocab)
        judged.checks, judged.calibration, judged.counts = outcome.checks, outcome.calibration, outcome.counts
    correct = all(c.passed for c in judged.checks + _engine_checks(cand))
    if config.speed.enabled and wl.speed and (correct or config.speed.run_on_fail) and cand.running():
        judged.speed, speed_checks = _speed(config, setup, wl, handles, judged.calibration, vocab, timings)
        judged.checks += speed_checks
    judged.stats = {role: h.stats() for role, h in handles.items() if h.usable}
    return judged


def _reference_alone(ref: EngineHandle, failure: ReferenceEngineFailure, timings: dict[str, float]) -> _Judged:
    """The reference failed while untrusted engines ran beside it (every engine is closed now). It makes the same
    calls again, in the same order, in a fresh process with no engine beside it. Failing alone too, the fault is
    its own or the host's: `failure` is raised and the gate has no verdict. Not failing, the fault was its
    company's (a candidate that holds the GPU's memory, say): the candidate fails, rather than ending the run."""
    alone = ref.again()
    try:
        with _timed(timings, "reference_alone"):
            alone.start()
            alone.replay(ref.made)
    except (ReferenceFailure, SandboxError) as e:
        if interrupted():
            raise GateInterrupted("the run was interrupted while the gate ran") from e
        raise failure from e
    finally:
        _close({"vanilla": alone})
    return _Judged(checks=[CheckResult.bounded(
        "engine.reference_alone", 0.0, lower=1.0,
        detail=f"beside the candidate, {failure}; alone, the reference made the same {len(ref.made)} call(s) "
               f"without failing")])


def _speed(config: GateConfig, setup: _Setup, wl: GateWorkloads, handles: dict[str, EngineHandle],
           calibration: Calibration | None, vocab: int, timings: dict[str, float]
           ) -> tuple[SpeedTable, list[CheckResult]]:
    """The speed table and its checks: no timed request began while the GPU still ran other work, and the
    candidate's timed outputs pass the reference's timed checks (a fast wrong answer is no speedup)."""
    ref = handles["vanilla"]
    with _timed(timings, "speed"):
        speed, timed = _measure_speed(setup, handles, wl.speed, config.speed)
    checks = [CheckResult.bounded(
        "speed.gpu_idle", float(speed.gpu_never_idle), upper=0.0,
        detail="timed requests that started while the GPU still ran other work (left by a frozen "
               "engine) after the idle wait's limit")]
    with _timed(timings, "timed_checks"):
        eos_ids = ref.build_info.eos_token_ids
        checks += timed_checks(ref, timed, calibration, config.thresholds, eos_ids, vocab,
                               wl.budget.max_seq_len, eos_gap_scale(setup.model_dir, eos_ids))
    return speed, checks


def _measure_speed(setup: _Setup, handles: dict[str, EngineHandle], workloads: tuple[SpeedWorkload, ...],
                   cfg: SpeedConfig) -> tuple[SpeedTable, TimedOutputs]:
    """The speed table and timed outputs, rotating candidate, parent, vanilla; a parent that is vanilla's tree was
    not started, and vanilla's rows stand for it."""
    order = {k: handles[k] for k in ("candidate", "parent", "vanilla") if k in handles}
    table, timed = measure_speed(order, workloads, cfg, setup.device)
    if _parent_is_vanilla(setup.snaps):
        table = vanilla_as_parent(table)
    return table, timed


def _gate_result(config: GateConfig, setup: _Setup, wl: GateWorkloads, cand: EngineHandle, judged: _Judged,
                 timings: dict[str, float], started: str, t0: float) -> GateResult:
    """The verdict over every check (engine, tree, then the judged ones) and the hashes that pin what was judged:
    the trees, the evaluator's source, the workloads, thresholds and config."""
    unchanged, tree_checks = _unchanged(setup.snaps)
    checks = _engine_checks(cand) + tree_checks + judged.checks
    failed = [c.name for c in checks if not c.passed]
    snaps = setup.snaps
    hashes = Hashes(candidate_tree=snaps["candidate"].sha256, reference_tree=snaps["vanilla"].sha256,
                    parent_tree=snaps["parent"].sha256 if "parent" in snaps else None,
                    snapshots=setup.snapshot_ids, trees_unchanged=unchanged,
                    evaluator_source=evaluator_source_sha256(), workloads_manifest=wl.manifest_digest,
                    workloads=wl.digest(), thresholds=_sha(config.thresholds.model_dump_json()),
                    config=_sha(config.model_dump_json()))
    return GateResult(
        verdict="fail" if failed else "pass", failed_checks=failed, checks=checks, calibration=judged.calibration,
        speed=judged.speed, hashes=hashes, isolation=_isolation_record(config, setup.isolation), model=config.model,
        model_dir=str(setup.model_dir), device=setup.device, candidate=str(snaps["candidate"].source),
        reference=str(snaps["vanilla"].source),
        parent=str(snaps["parent"].source) if "parent" in snaps else None,
        engine_stats={k: v for k, v in judged.stats.items() if isinstance(v, dict)}, counts=judged.counts,
        timings_s={k: round(v, 3) for k, v in timings.items()}, started_at=started,
        wall_s=round(time.monotonic() - t0, 3), config=config.model_dump(mode="json"))


def run_dev_benchmark(config: GateConfig) -> DevBenchmarkResult:
    """The dev speed table only (candidate, optional parent, vanilla E0): no correctness checks, no held-out data
    and no thresholds, so it is safe to hand to agents. Vanilla is config.reference (or its snapshot)."""
    t0 = time.monotonic()
    with scratch_dir("seis-devbench-") as tmp, ExitStack() as held:
        setup = _setup(config, tmp, {"candidate": config.candidate, "parent": config.parent,
                                     "vanilla": config.reference})
        workloads, budget, _ = load_speed_workloads(config, setup.model_dir)
        handles = _handles(config, setup, budget.max_seq_len, trusted={"vanilla"}, held=held)
        try:
            start_and_build(list(handles.values()))
            table, _ = _measure_speed(setup, handles, workloads, config.speed)
        finally:
            _close(handles)
        errors = [f"{role}: {f}" for role, h in handles.items() for f in h.failures]  # Failure.__str__
        return DevBenchmarkResult(candidate_tree=setup.snaps["candidate"].sha256, model=config.model,
                                  device=setup.device, speed=table, errors=errors,
                                  wall_s=round(time.monotonic() - t0, 3))
