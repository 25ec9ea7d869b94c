"""GPT (or any OpenAI-compatible endpoint: vLLM, llama.cpp server, OpenRouter...) through the official `openai`
SDK: chat completions with function calling. The client reads OPENAI_API_KEY and OPENAI_BASE_URL itself;
settings.base_url overrides the URL. Retries with backoff are the SDK's own (max_retries)."""
from __future__ import annotations

from .conversation import ToolCall, Turn
from .settings import LLMSettings
from .tools import TOOL_SPECS, ToolOutcome, parse_arguments


class OpenAIConversation:
    def __init__(self, settings: LLMSettings, system: str, user: str, client=None):
        if client is None:
            import openai  # lazy: only sessions that use this backend pay for the import
            client = openai.OpenAI(base_url=settings.base_url, max_retries=settings.max_retries,
                                   timeout=settings.request_timeout_s)
        self.client = client
        self.model = settings.resolved_model
        self.tools = [t.openai() for t in TOOL_SPECS]
        self.messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def ask(self, max_output_tokens: int) -> Turn:
        resp = self.client.chat.completions.create(model=self.model, messages=self.messages, tools=self.tools,
                                                   max_completion_tokens=max_output_tokens)
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
        assistant: dict = {"role": "assistant", "content": msg.content}
        if wire_calls:
            assistant["tool_calls"] = wire_calls
        self.messages.append(assistant)
        usage = resp.usage
        return Turn(msg.content or "", tuple(calls), usage.prompt_tokens if usage else 0,
                    usage.completion_tokens if usage else 0, choice.finish_reason,
                    resp.model_dump(mode="json", exclude_none=True))

    def answer(self, results: list[tuple[ToolCall, ToolOutcome]], note: str | None = None) -> None:
        for call, out in results:
            self.messages.append({"role": "tool", "tool_call_id": call.id,
                                  "content": f"ERROR: {out.text}" if out.is_error else out.text})
        if note:
            self.messages.append({"role": "user", "content": note})

    def nudge(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
