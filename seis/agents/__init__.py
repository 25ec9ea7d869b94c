"""Agents edit a session workspace: one interface, `edit(workspace, context) -> AgentResult`.

`seis.agents.offline` holds the deterministic library agent; LLM agents implement the same Protocol.
"""
from .report import (Lineage, SessionBlock, lineage, parse_session_block, render_block, render_report,
                     stamp_verdict)
from .llm.secrets import find_secrets
from .types import Adoption, Agent, AgentResult, Budget, Failure, SessionContext, Status

__all__ = ["Adoption", "Agent", "AgentResult", "Budget", "Failure", "Lineage", "SessionBlock", "SessionContext",
           "Status", "find_secrets", "lineage", "parse_session_block", "render_block", "render_report", "stamp_verdict"]
