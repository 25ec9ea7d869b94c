"""Local fake LLM APIs for tests: a threaded http.server on 127.0.0.1 (random port) that speaks the Anthropic
Messages wire format (POST /v1/messages) or OpenAI chat completions (POST /v1/chat/completions), answering from a
script. The real SDK clients talk to it; each request is recorded (path, headers, JSON body)."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Reply:
    """One model turn: optional text, tool calls [(name, args)] (OpenAI: args as a string are sent as the raw
    arguments text), usage (input, output tokens; None: the reply
    carries no usage), cache (cache-read, cache-write input tokens, reported the provider's way), and a delay
    before the answer is sent."""

    text: str = ""
    calls: tuple[tuple[str, dict], ...] = ()
    usage: tuple[int, int] | None = (100, 20)
    cache: tuple[int, int] = (0, 0)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Fail:
    """An HTTP error instead of a turn (the SDK retries 429 / 5xx / 529)."""

    status: int
    message: str = "try again"


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict
    t: float = field(default_factory=time.monotonic)  # when it arrived


Step = Reply | Fail | Callable[[Request], "Reply | Fail"]


@dataclass
class FakeAPI:
    kind: str                                # "anthropic" | "openai"
    script: list[Step]
    requests: list[Request] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                req = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw or b"{}"))
                status, body = api._answer(req)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                if status >= 400:
                    self.send_header("retry-after-ms", "5")  # keep the SDK's backoff short in tests
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}" + ("/v1" if self.kind == "openai" else "")

    def __enter__(self) -> "FakeAPI":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, req: Request) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(req)
            expected = "/v1/messages" if self.kind == "anthropic" else "/v1/chat/completions"
            if req.path != expected:
                return 404, self._error(404, f"unexpected path {req.path}")
            if not self.script:
                return 400, self._error(400, "fake script exhausted")
            step = self.script.pop(0)
            n = len(self.requests)
        if callable(step):
            step = step(req)
        if isinstance(step, Fail):
            return step.status, self._error(step.status, step.message)
        if step.delay_s:
            time.sleep(step.delay_s)
        return 200, (self._anthropic(step, n) if self.kind == "anthropic" else self._openai(step, n))

    def _error(self, status: int, message: str) -> dict:
        if self.kind == "anthropic":
            kind = {529: "overloaded_error", 429: "rate_limit_error", 401: "authentication_error"}.get(
                status, "api_error")
            return {"type": "error", "error": {"type": kind, "message": message}}
        return {"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error",
                          "code": None, "param": None}}

    @staticmethod
    def _anthropic(r: Reply, n: int) -> dict:
        content = ([{"type": "text", "text": r.text}] if r.text else []) + [
            {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": args}
            for i, (name, args) in enumerate(r.calls)]
        body = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "claude-fake",
                "content": content, "stop_reason": "tool_use" if r.calls else "end_turn", "stop_sequence": None}
        if r.usage is not None:  # input_tokens excludes the cached ones (Anthropic's way)
            body["usage"] = {"input_tokens": r.usage[0], "output_tokens": r.usage[1],
                             "cache_read_input_tokens": r.cache[0], "cache_creation_input_tokens": r.cache[1]}
        return body

    @staticmethod
    def _openai(r: Reply, n: int) -> dict:
        message: dict = {"role": "assistant", "content": r.text or None}
        if r.calls:
            message["tool_calls"] = [{"id": f"call_{n}_{i}", "type": "function",
                                      "function": {"name": name,
                                                   "arguments": args if isinstance(args, str) else json.dumps(args)}}
                                     for i, (name, args) in enumerate(r.calls)]
        body = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": "gpt-fake",
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if r.calls else "stop"}]}
        if r.usage is not None:  # prompt_tokens includes the cached ones (OpenAI's way)
            body["usage"] = {"prompt_tokens": r.usage[0] + r.cache[0], "completion_tokens": r.usage[1],
                             "total_tokens": sum(r.usage) + r.cache[0],
                             "prompt_tokens_details": {"cached_tokens": r.cache[0]}}
        return body


class BenchStub:
    """Stands in for SubprocessDevBenchmark in the cli agent: counts its calls and answers with `answer(root)`
    (the real benchmark's process handling is exercised in tests/test_host_boundary.py)."""

    def __init__(self, answer: Callable[[object], str]):
        self.answer, self.calls = answer, 0

    def for_parent(self, parent):
        return self

    def until(self, deadline):
        return self

    def __call__(self, root) -> str:
        self.calls += 1
        return self.answer(root)
