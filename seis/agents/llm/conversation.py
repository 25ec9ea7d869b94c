"""What the agent loop needs from a provider: ask (one API call on the history so far) and answer (tool
results back). Each backend keeps the history in its own API's message format."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .tools import ToolOutcome


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict | None            # None when the model's arguments could not be parsed
    error: str | None = None     # why not


@dataclass(frozen=True)
class Turn:
    text: str
    calls: tuple[ToolCall, ...]
    tokens_in: int
    tokens_out: int
    stop_reason: str | None
    raw: dict = field(default_factory=dict)  # the response as JSON, for the transcript


class Conversation(Protocol):
    model: str

    def ask(self, max_output_tokens: int) -> Turn: ...

    def answer(self, results: list[tuple[ToolCall, ToolOutcome]], note: str | None = None) -> None: ...

    def nudge(self, text: str) -> None: ...


def describe_error(e: BaseException) -> str:
    """One line for the report: the exception type, the HTTP status when there is one, a short message."""
    status = getattr(e, "status_code", None)
    msg = " ".join(str(e).split())[:300]
    return f"{type(e).__name__}" + (f" (HTTP {status})" if status else "") + (f": {msg}" if msg else "")
