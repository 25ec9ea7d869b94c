"""Whether and how a session's candidate is judged: the gate's three kinds of answer kept apart.

- a verdict (pass / fail): the candidate's own doing; failed checks are the reasons;
- a refusal (GateInputError: the workspace is not an engine tree the evaluator accepts): a rejection too;
- no verdict (the host killed an engine, e.g. the kernel's OOM killer, or the trusted reference broke): never the
  candidate's fault, so never a rejection; the session is not recorded and a resumed run redoes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..agents import AgentResult
from ..run_config import RunConfig
from ..workspace import Workspace
from .spec import SessionSpec


@dataclass(frozen=True)
class Judgement:
    gate_result: object | None          # GateResult, when a gate reached a verdict
    reasons: tuple[str, ...]            # failed checks, or why no gate ran
    host_failure: str = ""              # set when no verdict could be reached (not the candidate's doing)


def needs_gate(agent: AgentResult) -> bool:
    """Only an edited tree is gated: an unchanged engine has nothing to judge."""
    return agent.status == "edited"


def not_gated(agent: AgentResult) -> Judgement:
    return Judgement(None, (f"agent: {agent.status}",))


def judge(config: RunConfig, spec: SessionSpec, workspace: Workspace, parent_dir: Path) -> Judgement:
    from ..evaluator import GateInputError, HostFailure, ReferenceFailure
    from .steps import gate_workspace

    try:
        result = gate_workspace(config, spec, workspace, parent_dir)
    except GateInputError as e:  # e.g. the workspace ships files the evaluator refuses: rejected, not a crash
        return Judgement(None, (f"gate refused the workspace: {e}",))
    except HostFailure as e:
        return Judgement(None, (), host_failure=f"host failure: {e}")
    except ReferenceFailure as e:
        return Judgement(None, (), host_failure=f"no verdict, the reference failed: {e}")
    return Judgement(result, tuple(result.failed_checks))
