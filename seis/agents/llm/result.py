"""From what an LLM session did to an AgentResult: status, the standard report (with its ```seis-session block)
and short notes. Shared by the SDK agents and the cli agent."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..report import BLOCK_LANG, SessionBlock, render_report
from ..types import AgentResult, SessionContext, Status
from .redact import Redactor

DEFAULT_CHANGE = "llm-edit"  # the change name when the agent changed the tree but named nothing
# Change names a session may record: the agent chooses them, in any number, and they go into the session's block,
# the summary, the session line and (through the lineage) every later prompt of the chain and its peers.
MAX_CHANGES = 32
_FOREIGN_BLOCK = re.compile(r"```" + BLOCK_LANG + r".*?```", re.DOTALL)


@dataclass(frozen=True)
class SessionEnd:
    """How a session ended: finished by the agent, or stopped (budget, API failure, time)."""

    finished: bool
    reason: str                      # "finish", "token budget spent", "API error: ...", ...
    report: str = ""                 # the agent's own report text ("" when it never finished)
    changes: tuple[str, ...] = ()
    lessons: tuple[str, ...] = ()


def change_name(text: str) -> str:
    """'Fused RMSNorm kernel' -> 'fused-rmsnorm-kernel': names must be short, stable words for the lineage."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.strip().lower()).strip("-")[:64]


def status_for(changed: bool, end: SessionEnd) -> Status:
    if changed:
        return "edited"
    return "no_change" if end.finished else "failed"


def _demote(markdown: str) -> str:
    """The agent's text sits inside our ## Summary: its headings go one level down, foreign blocks out."""
    text = _FOREIGN_BLOCK.sub("", markdown)
    return re.sub(r"^(#{1,5})(\s)", r"#\1\2", text, flags=re.MULTILINE).strip()


def build_result(agent: str, context: SessionContext, changed: bool, end: SessionEnd, redactor: Redactor, *,
                 model: str | None, tokens_in: int = 0, tokens_out: int = 0, cost_usd: float = 0.0,
                 wall_s: float = 0.0, notes: str = "", rejected: str | None = None) -> AgentResult:
    """rejected: why the workspace cannot be gated (status "failed", nothing applied), or None."""
    status = "failed" if rejected else status_for(changed, end)
    named = tuple(c for c in (redactor.text(x) for x in end.changes) if "[REDACTED]" not in c)
    end = SessionEnd(end.finished, redactor.text(end.reason), end.report, named[:MAX_CHANGES], end.lessons)
    applied = (end.changes or (DEFAULT_CHANGE,)) if changed and not rejected else ()
    block = SessionBlock(context.chain, context.session, agent, tuple(applied))
    summary = _demote(end.report) if end.report.strip() else "_The agent wrote no report._"
    if not end.finished:
        summary = f"**Session stopped before the agent finished: {end.reason}.**\n\n{summary}"
    if rejected:
        summary = f"**SEIS rejected this session: {rejected}.**\n\n{summary}"
    changes = list(applied)
    lessons = list(end.lessons)
    if len(named) > MAX_CHANGES:
        lessons.append(f"The agent named {len(named):,} changes; only the first {MAX_CHANGES} are recorded.")
    if end.changes and not changed:
        lessons.append("The agent named changes (" + ", ".join(end.changes) + ") but the engine tree is unchanged.")
    report = render_report(block, summary, changes, lessons)
    return AgentResult(agent=agent, status=status, report_markdown=redactor.text(report),
                       notes=redactor.text(notes), applied=tuple(applied), attempted=tuple(applied), model=model,
                       tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=round(cost_usd, 6),
                       wall_s=round(wall_s, 3))
