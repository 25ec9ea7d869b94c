"""GPT (or any OpenAI-compatible endpoint: vLLM, llama.cpp server, OpenRouter...) through the official `openai`
SDK: chat completions with function calling. The client reads OPENAI_API_KEY and OPENAI_BASE_URL itself;
settings.base_url overrides the URL. Retries with backoff are the SDK's own (max_retries)."""
from __future__ import annotations

from .conversation import ToolCall, Turn, Usage, usage_count
from .settings import LLMSettings
from .text import valid_unicode
from .tools import TOOL_DEFINITIONS, ToolOutcome, parse_arguments


def openai_usage(u) -> Usage | None:
    """prompt_tokens includes prompt_tokens_details.cached_tokens (billed at the cached price). None (unknown) when
    a count is missing or not a whole number >= 0."""
    if u is None:
        return None
    details = getattr(u, "prompt_tokens_details", None)
    prompt, completion, cached = (usage_count(getattr(u, "prompt_tokens", None)),
                                  usage_count(getattr(u, "completion_tokens", None)),
                                  usage_count((getattr(details, "cached_tokens", None) or 0) if details is not None else 0))
    if prompt is None or completion is None or cached is None:
        return None
    cached = min(cached, prompt)
    return Usage(prompt - cached, completion, cached)


def content_text(content) -> str:
    """A reply message's text. The SDK builds its reply objects without checking types, so content is what the
    server sent: a string, None, or (some OpenAI-compatible servers) a list of parts, whose text parts are joined.
    Anything else raises here, inside the API call: the session ends like any malformed reply."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    raise TypeError(f"the reply's content is {type(content).__name__}, not text")


class OpenAIConversation:
    def __init__(self, settings: LLMSettings, system: str, user: str, client=None):
        if client is None:
            import openai  # lazy: only sessions that use this backend pay for the import
            client = openai.OpenAI(base_url=settings.base_url, max_retries=settings.max_retries,
                                   timeout=settings.request_timeout_s)
        self.client = client
        self.model = settings.resolved_model
        self.tools = [t.openai() for t in TOOL_DEFINITIONS]
        self.messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def ask(self, max_output_tokens: int, timeout_s: float | None = None) -> Turn:
        extra = {} if timeout_s is None else {"timeout": timeout_s}  # per attempt; the agent bounds the total
        resp = self.client.chat.completions.create(model=self.model, messages=self.messages, tools=self.tools,
                                                   max_completion_tokens=max_output_tokens, **extra)
        choice = resp.choices[0]
        msg = choice.message
        calls, wire_calls = [], []
        for tc in msg.tool_calls or []:
            fn = getattr(tc, "function", None)
            if fn is None:  # a non-function (custom) tool call: we offer none, so say so
                calls.append(ToolCall(tc.id, getattr(tc, "type", "?"), None, "only function tools exist"))
                wire_calls.append(tc.model_dump(mode="json", exclude_none=True))
                continue
            args, error = parse_arguments(fn.arguments)
            calls.append(ToolCall(tc.id, fn.name, args, error))
            wire_calls.append({"id": tc.id, "type": "function",
                               "function": {"name": fn.name, "arguments": fn.arguments or "{}"}})
        text = content_text(msg.content)
        assistant: dict = {"role": "assistant",
                           "content": msg.content if isinstance(msg.content, str) else text or None}
        if wire_calls:
            assistant["tool_calls"] = wire_calls
        self.messages.append(valid_unicode(assistant))  # sent again with every later request, as UTF-8 (text.py)
        return Turn(text, tuple(calls), openai_usage(getattr(resp, "usage", None)),
                    choice.finish_reason, resp.model_dump(mode="json", exclude_none=True))

    def answer(self, results: list[tuple[ToolCall, ToolOutcome]], note: str | None = None) -> None:
        for call, out in results:
            self.messages.append({"role": "tool", "tool_call_id": call.id,
                                  "content": f"ERROR: {out.text}" if out.is_error else out.text})
        if note:
            self.messages.append({"role": "user", "content": note})

    def nudge(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
