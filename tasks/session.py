"""A session as Prefect tasks: prepare -> agent edit -> build + gate -> snapshot -> report. Each task is one library
call; what to do with the gate's answer (retain, reject, no verdict) is decided in seis.session.

Task runs are named `c0/s1 <step>` and tagged `chain:c0`, `session:1` (by the flow). Arguments go in `quote()`d,
so Prefect infers no edges from values that merely look alike (interned strings, shared reports); each step's one
true upstream is the previous step, given as `wait_for`. The agent and gate steps have outer timeouts
(seis.session.timeouts); a step that times out, or a gate that reaches no verdict (the host killed an engine),
ends the session without an outcome: nothing is recorded and a resumed run redoes it."""
from __future__ import annotations

import time
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from seis.evaluator import render_gate_for_agents
from seis.run_config import RunConfig
from seis.session import (Retention, SessionOutcome, SessionResult, SessionSpec, decide, judge, needs_gate,
                          not_gated, prepare, record, run_agent, snapshot_or_keep_parent)
from seis.session.display import run_label, session_markdown
from seis.session.progress import progress_line
from seis.session.timeouts import step_timeouts
from seis.store import SnapshotStore

from .artifacts import stable_key
from .cancelled import refuse_if_cancelled
from .gpu import device_limit, gpu_slot

_NAME = "{spec.chain}/s{spec.session} "


@task(name="prepare-workspace", task_run_name=_NAME + "prepare-workspace", cache_policy=NO_CACHE)
def prepare_workspace_task(spec: SessionSpec, store_root: Path):
    spec.session_dir.mkdir(parents=True, exist_ok=True)
    parent_dir = SnapshotStore(store_root).get(spec.parent_snapshot, spec.session_dir / "parent")
    return prepare(spec, parent_dir), parent_dir


@task(name="agent-edit", task_run_name=_NAME + "agent-edit", cache_policy=NO_CACHE)
def agent_edit_task(config: RunConfig, spec: SessionSpec, workspace):
    return run_agent(config, spec, workspace)


@task(name="build-and-gate", task_run_name=_NAME + "build-and-gate", cache_policy=NO_CACHE)
def gate_task(config: RunConfig, spec: SessionSpec, workspace, parent_dir: Path):
    # The evaluator builds every engine (weights, KV cache, CUDA graphs) in its own process, then gates.
    with gpu_slot(run_label(spec.chain, spec.session) + " build-and-gate", device_limit(spec.device_slot)):
        return judge(config, spec, workspace, parent_dir)


# No retries: a tree the store cannot take comes back as "not retained" (a refusal would only be refused again).
@task(name="snapshot", task_run_name=_NAME + "snapshot", cache_policy=NO_CACHE)
def snapshot_task(store_root: Path, spec: SessionSpec, gate_result, retained: bool,
                  reasons: tuple[str, ...]) -> Retention:
    return snapshot_or_keep_parent(SnapshotStore(store_root), spec, gate_result, retained, reasons)


@task(name="session-report", task_run_name=_NAME + "report", cache_policy=NO_CACHE)
def report_task(spec: SessionSpec, workspace, agent_result, gate_result, snapshot: str, retained: bool,
                reasons: tuple[str, ...], wall_s: float, objective: str) -> SessionOutcome:
    outcome = record(spec, workspace, agent_result, gate_result, snapshot, retained, reasons, wall_s, objective)
    measurements = render_gate_for_agents(gate_result) if gate_result is not None else ""
    create_markdown_artifact(session_markdown(outcome, measurements, spec.session_dir),
                             key=stable_key("session", spec.chain, f"s{spec.session}"),
                             description=f"SEIS session {spec.chain}/s{spec.session} of run {spec.run_id}: "
                                         f"{outcome.verdict}")
    return outcome


def _step(step, *args, after=None, timeout_s: float | None = None):
    """Run one step as a child task run; its only upstream edge is `after` (the previous step's future). A future,
    not a state: Prefect would search a state's data for values that other tasks returned (an empty tuple is one
    object for every chain) and draw edges to them. An interrupted or cancelled run starts no further step
    (RunCancelled): a verdict that came back after Ctrl-C is not snapshotted or recorded, and a resume redoes it."""
    refuse_if_cancelled(flow_run.get_id(), ask_server=False)
    if timeout_s is not None:
        step = step.with_options(timeout_seconds=timeout_s)
    future = step.submit(*(quote(a) for a in args), wait_for=[after] if after is not None else None)
    return future.result(), future


@task(name="session", task_run_name=_NAME + "session", cache_policy=NO_CACHE)
def session_task(config: RunConfig, spec: SessionSpec, store_root: Path) -> SessionResult:
    t0, limits, label = time.monotonic(), step_timeouts(config), run_label(spec.chain, spec.session)
    (workspace, parent_dir), last = _step(prepare_workspace_task, spec, store_root)
    try:
        agent_result, last = _step(agent_edit_task, config, spec, workspace, after=last, timeout_s=limits.agent_s)
        if needs_gate(agent_result):
            judgement, last = _step(gate_task, config, spec, workspace, parent_dir, after=last,
                                    timeout_s=limits.gate_s)
        else:
            judgement = not_gated(agent_result)
    except TimeoutError as e:
        return SessionResult(spec.chain, spec.session, failure=f"{label}: a step timed out ({e})")
    if judgement.host_failure:
        return SessionResult(spec.chain, spec.session, failure=f"{label}: {judgement.host_failure}")
    retained, reasons = decide(spec, judgement.gate_result, judgement.reasons, config.objective)
    (snapshot, retained, reasons), last = _step(snapshot_task, store_root, spec, judgement.gate_result, retained,
                                                reasons, after=last)
    outcome, _ = _step(report_task, spec, workspace, agent_result, judgement.gate_result, snapshot, retained,
                       reasons, time.monotonic() - t0, config.objective, after=last)
    # speedups, noise, the run's best so far
    print(progress_line(spec.session_dir, agent_result.notes, outcome, config.objective))
    return SessionResult(spec.chain, spec.session, outcome=outcome)
