"""Claude through the official `anthropic` SDK: Messages API with tool use. The client reads ANTHROPIC_API_KEY
(or ANTHROPIC_AUTH_TOKEN) and ANTHROPIC_BASE_URL itself; settings.base_url overrides the URL. Retries on
429 / 5xx / 529 (overloaded) with backoff are the SDK's own (max_retries)."""
from __future__ import annotations

from .conversation import ToolCall, Turn, Usage, usage_count
from .settings import LLMSettings
from .text import valid_unicode
from .tools import TOOL_DEFINITIONS, ToolOutcome, parse_arguments


def _param(block) -> dict | None:
    """A response content block as a request content block (only the fields the API takes back)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return {"type": "text", "text": block.text} if block.text else None  # empty text blocks are refused
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if kind == "thinking":
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if kind == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.data}
    return block.model_dump(mode="json", exclude_none=True)


def anthropic_usage(u) -> Usage | None:
    """input_tokens excludes cache reads and writes; cache_creation (when present) splits the writes by
    lifetime (5 minutes at 1.25x, 1 hour at 2x). None (unknown) when a count is missing or not a whole number >= 0."""
    if u is None:
        return None
    split = getattr(u, "cache_creation", None)
    counts = (usage_count(getattr(u, "input_tokens", None)), usage_count(getattr(u, "output_tokens", None)),
              usage_count(getattr(u, "cache_read_input_tokens", None) or 0),
              usage_count(getattr(u, "cache_creation_input_tokens", None) or 0),
              usage_count((getattr(split, "ephemeral_1h_input_tokens", None) or 0) if split is not None else 0))
    if None in counts:
        return None
    inp, out, reads, writes, w1h = counts
    w1h = min(w1h, writes)
    return Usage(inp, out, reads, writes - w1h, w1h)


class AnthropicConversation:
    def __init__(self, settings: LLMSettings, system: str, user: str, client=None):
        if client is None:
            import anthropic  # lazy: only sessions that use Claude pay for the import
            client = anthropic.Anthropic(base_url=settings.base_url, max_retries=settings.max_retries,
                                         timeout=settings.request_timeout_s)
        self.client = client
        self.model = settings.resolved_model
        self.system = system
        self.tools = [t.anthropic() for t in TOOL_DEFINITIONS]
        self.messages: list[dict] = [{"role": "user", "content": user}]

    def ask(self, max_output_tokens: int, timeout_s: float | None = None) -> Turn:
        extra = {} if timeout_s is None else {"timeout": timeout_s}  # per attempt; the agent bounds the total
        resp = self.client.messages.create(model=self.model, max_tokens=max_output_tokens, system=self.system,
                                           tools=self.tools, messages=self.messages, **extra)
        # sent again with every later request, which the SDK encodes as UTF-8 (text.py)
        content = valid_unicode([p for p in (_param(b) for b in resp.content) if p is not None])
        self.messages.append({"role": "assistant", "content": content or [{"type": "text", "text": "(empty)"}]})
        calls = tuple(ToolCall(b.id, b.name, *(parse_arguments(b.input) if isinstance(b.input, dict)
                                               else (None, "arguments must be a JSON object")))
                      for b in resp.content if b.type == "tool_use")
        text = "\n".join(b.text for b in resp.content if b.type == "text")
        return Turn(text, calls, anthropic_usage(getattr(resp, "usage", None)), resp.stop_reason,
                    resp.model_dump(mode="json", exclude_none=True))

    def answer(self, results: list[tuple[ToolCall, ToolOutcome]], note: str | None = None) -> None:
        blocks: list[dict] = [{"type": "tool_result", "tool_use_id": call.id, "content": out.text,
                               "is_error": out.is_error} for call, out in results]
        if note:
            blocks.append({"type": "text", "text": note})
        self.messages.append({"role": "user", "content": blocks})

    def nudge(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
