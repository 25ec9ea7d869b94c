"""The steps of one session. Each is a plain function; tasks/ wraps each in a Prefect task."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from ..agents import AgentResult, Budget, SessionContext, find_secrets, stamp_verdict
from ..agents.llm.confine import sanitize_workspace
from ..files import write_atomic
from ..run_config import AGENTS_AVAILABLE, RunConfig
from ..store import DvcError, StoreError, TreeRefused
from ..workspace import Report, Workspace, prepare_workspace
from ..workspace.tree import TreeError
from .objective import slower_than_parent
from .progress import dev_speedups
from .resume import save_outcome
from .reuse import reused_from
from .spec import SessionOutcome, SessionSpec

STORE_ERROR = "store_error.txt"  # in a session's directory: why the store failed on the host, for the operator


def make_agent(config: RunConfig):
    if config.agent == "offline":
        from ..agents.offline import OfflineAgent
        from ..agents.offline.library import load_library
        return OfflineAgent(load_library(config.agent_library) if config.agent_library else None)
    if config.agent in ("anthropic", "openai", "cli"):
        from ..agents.llm import make_llm_agent
        return make_llm_agent(config)
    raise ValueError(f"agent {config.agent!r} is not available yet (available: {', '.join(AGENTS_AVAILABLE)})")


def prepare(spec: SessionSpec, parent_dir: Path) -> Workspace:
    """A fresh workspace: the parent's engine tree plus inherited reports (and peers' materials at a sync)."""
    return prepare_workspace(parent_dir, spec.session_dir / "workspace", list(spec.inherited), list(spec.peers))


def run_agent(config: RunConfig, spec: SessionSpec, workspace: Workspace) -> AgentResult:
    context = SessionContext(chain=spec.chain, session=spec.session, chain_index=spec.chain_index,
                             inherited_reports=spec.inherited, peers=spec.peers, run_id=spec.run_id,
                             session_dir=spec.session_dir,
                             budget=Budget(max_transformations=config.max_transformations,
                                           max_tokens=config.max_tokens, max_cost_usd=config.max_cost_usd))
    try:
        result = make_agent(config).edit(workspace, context)
    except BaseException:
        # Interrupted (Ctrl-C, a cancellation) or failed before the agent made its tree safe: its sandbox has died
        # with it, and what it left is made safe now, not when someone next looks there (a resume clears it).
        sanitize_workspace(workspace.root, skip=workspace.laid_out)
        raise
    (spec.session_dir / "agent.json").write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result


def gated_dir(spec: SessionSpec) -> Path:
    """Where the gate leaves the exact tree it passed (what gets retained)."""
    return spec.session_dir / "gated"


def gate_config(config: RunConfig, spec: SessionSpec | None = None, **values):
    """The GateConfig a session's gate runs with (also what the memory preflight sizes); without a spec, the
    run-level part only (no candidate or snapshots)."""
    from ..evaluator import GateConfig

    values = dict(model=config.model, device=config.device, seed=config.seed, store=config.store, **values)
    if spec is not None:
        values.update(parent_snapshot=spec.parent_snapshot, reference_snapshot=spec.vanilla_snapshot or None,
                      retain_dir=gated_dir(spec))
    return GateConfig.preset(config.gate, **values)


def gate_workspace(config: RunConfig, spec: SessionSpec, workspace: Workspace, parent_dir: Path):
    """The development gate on the workspace's engine tree; returns the GateResult (also saved as gate.json,
    beside the workspace, where no agent looks). The vanilla and parent engines come from the snapshot store.
    A candidate this run has already judged takes that verdict (`reuse`: gate-reused.json names the session)."""
    from ..evaluator import run_gate
    from .reuse import remember_verdict, reuse_verdict

    judged_by = gate_config(config, spec, candidate=workspace.root, parent=parent_dir)
    reused = reuse_verdict(judged_by, spec.session_dir, gated_dir(spec))
    if reused is not None:
        return reused.result
    result = run_gate(judged_by)
    (spec.session_dir / "gate.json").write_text(result.model_dump_json(indent=2) + "\n")
    remember_verdict(judged_by, spec.session_dir, result)
    return result


def record(spec: SessionSpec, workspace: Workspace, agent: AgentResult, gate_result, snapshot: str,
           retained: bool, reasons: tuple[str, ...], wall_s: float, objective: str = "none") -> SessionOutcome:
    """Write workspace.diff and report.md (the agent's notes + the gate's verdict and table); build the outcome, its
    dev speedups taken on the workloads of the run's objective (progress.ranked_workloads)."""
    from ..evaluator import render_gate_for_agents

    (spec.session_dir / "workspace.diff").write_text(_diff_or_reason(workspace, reasons),
                                                      errors="backslashreplace")
    verdict_word = "retained" if retained else "rejected"
    # report.md is inherited by later agents: verdict and dev checks only (gate.json keeps the rest)
    measurements = render_gate_for_agents(gate_result) if gate_result is not None else \
        f"No gate run: {'; '.join(reasons)}."
    if gate_result is not None and gate_result.verdict == "pass" and not retained:  # say why a pass was dropped
        measurements = f"{'; '.join(reasons)}\n\n{measurements}"
    reused = reused_from(spec.session_dir)
    if reused and gate_result is not None:
        measurements = (f"This exact candidate (same parent and reference) was gated in {reused} of this run; "
                        f"its verdict and measurements are reused.\n\n{measurements}")
    markdown = stamp_verdict(agent.report_markdown, verdict_word, measurements)
    (spec.session_dir / "report.md").write_text(markdown)
    vs_vanilla, vs_parent = dev_speedups(gate_result.speed if gate_result is not None else None, objective)
    verdict = gate_result.verdict if gate_result is not None else ("no_change" if agent.status == "no_change"
                                                                    else "error")
    outcome = SessionOutcome(
        chain=spec.chain, session=spec.session, parent_snapshot=spec.parent_snapshot, snapshot=snapshot,
        retained=retained, verdict=verdict, reasons=reasons, dev_speedup_vs_vanilla=vs_vanilla,
        dev_speedup_vs_parent=vs_parent, synced_from=spec.synced_from, agent=agent.agent,
        applied=agent.applied, adopted=tuple(a.name for a in agent.adopted), tokens_in=agent.tokens_in,
        tokens_out=agent.tokens_out, cost_usd=agent.cost_usd, wall_s=wall_s,
        report=Report(spec.chain, spec.session, markdown, verdict_word))
    save_outcome(spec.session_dir, outcome)  # last: its presence means the session is finished (see resume.py)
    return outcome


def _diff_or_reason(workspace: Workspace, reasons: tuple[str, ...] = ()) -> str:
    """The session's diff; a tree that cannot be diffed (a link leading out, an unreadable file) gets a note
    instead of ending the run (the gate has already refused such a tree), and so does an empty one: a refused
    workspace is emptied unread, and a diff deleting every file would say nothing of what the agent did."""
    from ..workspace.tree import TreeError
    try:
        if workspace.root.is_dir() and not any(workspace.root.iterdir()):
            why = "; ".join(reasons) or "the workspace is empty"
            return f"# no diff: the workspace is empty. {why}\n"
        return workspace.diff()
    except (TreeError, OSError, UnicodeError) as e:
        return f"# no diff: the workspace cannot be read as an engine tree: {e}\n"


def decide(spec: SessionSpec, gate_result, reasons: tuple[str, ...], objective: str = "both"
           ) -> tuple[bool, tuple[str, ...]]:
    """Retain only a passing candidate that is not slower than its parent or than vanilla beyond measured noise on a
    timed workload of the run's objective (seis.session.objective), and whose judged tree holds no secret: a key in
    engine code would travel with the snapshot to every later session, peer and remote."""
    if gate_result is None or gate_result.verdict != "pass":
        return False, reasons
    slower = slower_than_parent(gate_result.speed, objective)
    if slower:
        return False, tuple(f"not retained: {line}" for line in slower)
    leaks = find_secrets(gated_dir(spec))
    if leaks:
        return False, ("not retained: the judged tree holds a secret or an unscannable file: "
                       + "; ".join(leaks[:3]),)
    return True, reasons


class Retention(NamedTuple):
    """What a session ends on: its snapshot (the parent's when not retained), whether it was retained, and why not."""
    snapshot: str
    retained: bool
    reasons: tuple[str, ...]


def snapshot_or_keep_parent(store, spec: SessionSpec, gate_result, retained: bool,
                            reasons: tuple[str, ...]) -> Retention:
    """snapshot_if_retained, except that a tree the store cannot take (control files in it, DVC failing) ends only
    this session: not retained, the parent's snapshot kept, and the run goes on. The store leaves nothing of the
    failed snapshot behind, and a refusal is not retried (it would be refused again). The reasons reach later
    agents (report.md), so they quote only a refusal of the tree itself, in the tree's terms; what failed on the
    host (DVC's output, the store's paths, a remote's URL) goes to STORE_ERROR in the session's directory, for the
    operator."""
    try:
        return Retention(snapshot_if_retained(store, spec, gate_result, retained), retained, reasons)
    except TreeRefused as e:
        why = f"not retained: the snapshot could not be stored: {e.detail.strip().splitlines()[0]}"
    except (StoreError, DvcError, OSError, TreeError) as e:
        # the operator's alone: DVC's text may name a remote's URL with its credentials
        write_atomic(Path(spec.session_dir) / STORE_ERROR, f"{type(e).__name__}: {e}\n", mode=0o600)
        why = f"not retained: the snapshot could not be stored: the snapshot store failed (see {STORE_ERROR})"
    return Retention(spec.parent_snapshot, False, (*reasons, why))


def snapshot_if_retained(store, spec: SessionSpec, gate_result, retained: bool) -> str:
    """Store exactly the tree the gate judged (its private copy, re-hashed), never the live workspace."""
    if not retained:
        return spec.parent_snapshot
    from ..evaluator.snapshot import tree_sha256
    gated = gated_dir(spec)
    if tree_sha256(gated) != gate_result.hashes.candidate_tree:
        raise RuntimeError(f"{gated} is not the tree the gate judged; nothing retained")
    return store.put(gated, {"run": spec.run_id, "chain": spec.chain, "session": spec.session,
                             "parent": spec.parent_snapshot, "gate_tree": gate_result.hashes.candidate_tree})
