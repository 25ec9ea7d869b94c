"""A session as Prefect tasks: prepare -> agent edit -> build + gate -> retain or reject -> report -> snapshot."""
from __future__ import annotations

import re
import time
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency

from seis.config import RunConfig
from seis.evaluator import GateInputError
from seis.session import (SessionOutcome, SessionSpec, decide, gate_workspace, prepare, record, run_agent,
                          snapshot_if_retained)
from seis.store import SnapshotStore

from .gpu import GPU_LIMIT


@task(name="prepare-workspace", cache_policy=NO_CACHE)
def prepare_workspace_task(spec: SessionSpec, store_root: Path):
    spec.session_dir.mkdir(parents=True, exist_ok=True)
    parent_dir = SnapshotStore(store_root).get(spec.parent_snapshot, spec.session_dir / "parent")
    return prepare(spec, parent_dir), parent_dir


@task(name="agent-edit", cache_policy=NO_CACHE)
def agent_edit_task(config: RunConfig, spec: SessionSpec, workspace):
    return run_agent(config, spec, workspace)


@task(name="build-and-gate", cache_policy=NO_CACHE)
def gate_task(config: RunConfig, spec: SessionSpec, workspace, parent_dir: Path):
    # The evaluator builds every engine (weights, KV cache, CUDA graphs) in its own process, then gates.
    with concurrency(GPU_LIMIT, occupy=1, strict=True):
        return gate_workspace(config, spec, workspace, parent_dir)


@task(name="snapshot", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def snapshot_task(store_root: Path, spec: SessionSpec, gate_result, retained: bool) -> str:
    return snapshot_if_retained(SnapshotStore(store_root), spec, gate_result, retained)


@task(name="session-report", cache_policy=NO_CACHE)
def report_task(spec: SessionSpec, workspace, agent_result, gate_result, snapshot: str, retained: bool,
                reasons: tuple[str, ...], wall_s: float) -> SessionOutcome:
    outcome = record(spec, workspace, agent_result, gate_result, snapshot, retained, reasons, wall_s)
    create_markdown_artifact(outcome.report.markdown, key=_key(f"{spec.run_id}-{spec.chain}-{spec.session}"),
                             description=f"SEIS session {spec.chain}/{spec.session}: {outcome.verdict}")
    return outcome


@task(name="session", cache_policy=NO_CACHE)
def session_task(config: RunConfig, spec: SessionSpec, store_root: Path) -> SessionOutcome:
    t0 = time.monotonic()
    workspace, parent_dir = prepare_workspace_task(spec, store_root)
    agent_result = agent_edit_task(config, spec, workspace)
    gate_result, reasons = None, ()
    if agent_result.status != "edited":
        reasons = (f"agent: {agent_result.status}",)   # an unchanged engine has nothing to gate
    else:
        try:
            gate_result = gate_task(config, spec, workspace, parent_dir)
            reasons = tuple(gate_result.failed_checks)
        except GateInputError as e:  # e.g. the workspace ships files the evaluator refuses: rejected, not a crash
            reasons = (f"gate refused the workspace: {e}",)
    retained, reasons = decide(spec, gate_result, reasons)
    snapshot = snapshot_task(store_root, spec, gate_result, retained)
    outcome = report_task(spec, workspace, agent_result, gate_result, snapshot, retained, reasons,
                          time.monotonic() - t0)
    status = "retained" if retained else "kept parent"
    print(f"[{spec.chain} s{spec.session}] {agent_result.notes} -> {outcome.verdict}, {status} ({snapshot})")
    return outcome


def _key(text: str) -> str:
    # artifact keys: lowercase letters, digits and dashes only
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
