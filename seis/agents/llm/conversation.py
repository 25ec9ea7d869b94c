"""What the agent loop needs from a provider: ask (one API call on the history so far) and answer (tool
results back). Each backend keeps the history in its own API's message format."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

from .text import valid_unicode
from .tools import ToolOutcome


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict | None            # None when the model's arguments could not be parsed
    error: str | None = None     # why not

    def __post_init__(self) -> None:  # the model's strings, as every later writer can take them (text.py)
        for name in ("id", "name", "args", "error"):
            object.__setattr__(self, name, valid_unicode(getattr(self, name)))


@dataclass(frozen=True)
class Usage:
    """Tokens of one reply, by how the provider bills them."""

    input: int                  # input tokens at the full price (cached ones excluded)
    output: int
    cache_read: int = 0         # Anthropic cache reads / OpenAI cached prompt tokens
    cache_write: int = 0        # Anthropic 5-minute cache writes
    cache_write_1h: int = 0     # Anthropic 1-hour cache writes

    @property
    def tokens_in(self) -> int:
        """Every input token the model processed (what a token budget counts)."""
        return self.input + self.cache_read + self.cache_write + self.cache_write_1h


MAX_USAGE_COUNT = 10**9  # tokens in one reply's count: far past any context window


def usage_count(v: object) -> int | None:
    """A token count as a reply states it, or None unless it is a whole number from 0 to MAX_USAGE_COUNT: a
    negative, NaN or infinite count fed to the meter would lower or poison what was spent, and the budget would
    never be reached; a 400-digit one made the cost overflow and went on, as the session's token count, into its
    records."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_USAGE_COUNT else None


@dataclass(frozen=True)
class Turn:
    text: str
    calls: tuple[ToolCall, ...]
    usage: Usage | None         # None: the reply carried no usage (unknown, never counted as 0)
    stop_reason: str | None
    raw: dict = field(default_factory=dict)  # the response as JSON, for the transcript

    def __post_init__(self) -> None:
        # A backend's checks missed a malformed reply: it raises inside the API call, never where the loop takes
        # the text for the report (after edit()'s last guard, which stopped the run).
        if not isinstance(self.text, str):
            raise TypeError(f"a reply's text must be a string, not {type(self.text).__name__}")
        # the model's strings, as every later writer can take them (text.py)
        for name in ("text", "stop_reason", "raw"):
            object.__setattr__(self, name, valid_unicode(getattr(self, name)))

    @property
    def tokens_in(self) -> int | None:
        return None if self.usage is None else self.usage.tokens_in

    @property
    def tokens_out(self) -> int | None:
        return None if self.usage is None else self.usage.output


class Conversation(Protocol):
    model: str

    def ask(self, max_output_tokens: int, timeout_s: float | None = None) -> Turn: ...

    def answer(self, results: list[tuple[ToolCall, ToolOutcome]], note: str | None = None) -> None: ...

    def nudge(self, text: str) -> None: ...


def describe_error(e: BaseException, redact: Callable[[str], str] = str) -> str:
    """One line for the report: the exception type, the HTTP status when there is one, a short message. `redact`
    runs before the cut: a key a provider's error echoes across the 300th character would otherwise keep a
    fragment too short for the redactor to know."""
    status = getattr(e, "status_code", None)
    msg = redact(" ".join(str(e).split()))[:300]
    return f"{type(e).__name__}" + (f" (HTTP {status})" if status else "") + (f": {msg}" if msg else "")
