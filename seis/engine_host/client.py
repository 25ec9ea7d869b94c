"""Parent-process side: start a worker, send requests, enforce time limits, never share memory with the engine."""
from __future__ import annotations

import json
import math
import os
import queue
import secrets
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ..engine_import import check_engine_dir
from ..sandbox import SandboxedProcess, WriteWatch, cgroup
from .policy import ENGINE_MOUNT, MODEL_MOUNT, WORKER, engine_policy, forbidden_paths

MAX_REPLY_BYTES = 64 * 2**20   # one reply line; a longer one is an engine error, not host memory
OVERSIZED = object()


MAX_STATS = 64          # names in an engine's stats that the host keeps
MAX_STAT_CHARS = 256    # the longest name or text value kept
MAX_STAT_LIST = 256     # the longest list kept (graph batch sizes, say)


def plain_stats(value: Any) -> dict[str, Any]:
    """An engine's stats as the host keeps them (gate.json, postval.json, the benchmarks' JSON): at most MAX_STATS
    names, each with a number, a boolean, None, a short text or a short list of those. Stats are shown, never
    relied on, and the engine may be a candidate: whatever else it replies (nesting thousands of levels deep, 64 MiB
    of text) is left out here, so no reply can shape, swell or break the files the host writes."""
    if not isinstance(value, dict):
        return {}
    kept = {}
    for name, v in value.items():
        if len(kept) == MAX_STATS:
            break
        if not isinstance(name, str) or len(name) > MAX_STAT_CHARS:
            continue
        if _plain(v) or (type(v) is list and len(v) <= MAX_STAT_LIST and all(_plain(x) for x in v)):
            kept[name] = v
    return kept


def _plain(v: Any) -> bool:
    if type(v) is int:
        return abs(v) < 2**63
    if type(v) is float:
        return math.isfinite(v)  # NaN and infinity are not JSON
    return v is None or type(v) is bool or (type(v) is str and len(v) <= MAX_STAT_CHARS)


MAX_FINISH_CHARS = 16   # of a finish reason kept: the contract's are "stop" and "length", a longer one is wrong
MAX_ERROR_CHARS = 2000  # of an error reply kept: its start names the exception and what went wrong


def error_text(error: Any) -> str:
    """An engine's error reply as the host keeps it: its first MAX_ERROR_CHARS characters, and how many it left
    out. Each failed call's message is held until the gate ends and written into its checks, speed rows and the
    dev benchmark's errors; a reply line may hold 64 MiB of message."""
    text = error if isinstance(error, str) else "unknown engine error"
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return f"{text[:MAX_ERROR_CHARS]}… ({len(text) - MAX_ERROR_CHARS} characters left out)"


def bounded_generations(reply: Any, params: list[Sampling]) -> Any:
    """A generate reply cut to what its request can be judged by: one output past the prompts at most, each with
    max_new_tokens + 1 ids (one over the limit still shows it went over), a finish reason of MAX_FINISH_CHARS and
    nothing else. A reply line may hold 64 MiB: 33 million ids, a list of a GB in the host, and the gate and
    post-validation keep every timed output of every repetition until it is judged, in the host's memory, not the
    sandbox's. What is not a list of mappings is left as it is, for the caller to reject."""
    if not isinstance(reply, list):
        return reply
    kept: list[Any] = []
    for i, out in enumerate(reply[: len(params) + 1]):
        if isinstance(out, dict):
            ids, finish = out.get("token_ids"), out.get("finish_reason")
            limit = params[i].max_new_tokens + 1 if i < len(params) else 1
            out = {"token_ids": ids[:limit] if isinstance(ids, list) else ids,
                   "finish_reason": finish[:MAX_FINISH_CHARS] if isinstance(finish, str) else finish}
        kept.append(out)
    return kept


def bounded_scores(reply: Any, continuations: list[list[int]], top_k: int) -> Any:
    """A score or verify reply cut as bounded_generations cuts a generate reply: one entry past the continuations
    at most, one position past each continuation, one candidate past top_k at each position, nothing else."""
    if not isinstance(reply, list):
        return reply
    kept: list[Any] = []
    for i, out in enumerate(reply[: len(continuations) + 1]):
        if isinstance(out, dict):
            n = len(continuations[i]) + 1 if i < len(continuations) else 1
            lps, ids, tops = (out.get(k) for k in ("token_logprobs", "top_ids", "top_logprobs"))
            cut = lambda rows: [r[: top_k + 1] if isinstance(r, list) else r for r in rows[:n]] \
                if isinstance(rows, list) else rows  # noqa: E731
            out = {"token_logprobs": lps[:n] if isinstance(lps, list) else lps, "top_ids": cut(ids),
                   "top_logprobs": cut(tops)}
        kept.append(out)
    return kept


class EngineError(RuntimeError):
    """The engine raised, crashed, or answered something unreadable."""


class EngineTimeout(EngineError):
    """The engine did not answer in time; its process was killed."""


class EngineExited(EngineError):
    """The engine process ended without answering. `returncode` is its exit status (negative: the signal);
    `host_oom`: whether the kernel's out-of-memory killer killed anything on the host while it ran (None: the
    kernel does not say); `watch_killed`: the host killed it for writing past its limits; `bound_oom`: the kernel
    killed in its sandbox because the sandbox reached its own memory bound."""

    def __init__(self, message: str, returncode: int | None, host_oom: bool | None = None,
                 watch_killed: bool = False, bound_oom: bool = False):
        super().__init__(message)
        self.returncode, self.host_oom, self.watch_killed = returncode, host_oom, watch_killed
        self.bound_oom = bound_oom

    @property
    def sigkilled(self) -> bool:
        """Ended by SIGKILL without a word of its own (-9, or 137 when a sandbox's init reports its child's signal
        as an exit status): the OOM killer's way, and any process's that kills itself."""
        return self.returncode in (-9, 128 + 9)

    @property
    def killed_by_host(self) -> bool:
        """The SIGKILL was most likely the kernel's OOM killer, not the engine's doing: nothing to charge to the
        engine. An engine that kills itself while no OOM kill happens, that the write watch ends, or that reaches
        its sandbox's memory bound (the kernel counts that OOM kill on the host too) is not."""
        return self.sigkilled and not self.watch_killed and not self.bound_oom and self.host_oom is not False


@dataclass(frozen=True)
class Sampling:
    """What the worker turns into the engine's SamplingParams."""
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)


class EngineProcess:
    """One engine in one sandboxed child process (seis.sandbox): use as a context manager; `call` ops mirror
    CONTRACT.md. The engine sees its tree at /engine and the model at /model, both read-only, and nothing of
    SEIS but the worker script. Closing it ends every process the engine started.

    env: extra variables over the allow-listed environment; memory_bytes: RLIMIT_AS (CPU only); cache_dir: a
    host directory the engine may write its JIT caches to (else they live in the sandbox's private /tmp);
    sandbox_memory_bytes: the whole sandbox's host-memory bound (engine_host.policy.engine_sandbox_memory_bytes).
    """

    def __init__(self, engine_dir: str | Path, model_dir: str | Path, options: dict | None = None,
                 timeout_s: float = 600.0, env: Mapping[str, str] | None = None, *,
                 memory_bytes: int | None = None, cache_dir: Path | None = None,
                 sandbox_memory_bytes: int | None = None):
        self.engine_dir = check_engine_dir(engine_dir)
        self.model_dir = Path(model_dir)
        self.options = options or {}
        self.timeout_s = timeout_s
        self.policy = engine_policy(self.engine_dir, self.model_dir, self.options.get("device"), env,
                                    memory_bytes, cache_dir, sandbox_memory_bytes)
        self.box: SandboxedProcess | None = None
        self.watch: WriteWatch | None = None
        self.proc: subprocess.Popen | None = None
        self.stderr_path: Path | None = None
        self._stderr_fd: int | None = None   # the log as created: read through it, never through its path
        self._oom_kills_at_start: int | None = None
        # One reply per request, so one line waits here at most: an engine writing lines nobody asked for fills
        # its own pipe and stalls, never host memory (and its next reply is refused as a forgery).
        self._lines: queue.Queue[str | None] = queue.Queue(maxsize=1)

    def __enter__(self) -> "EngineProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._oom_kills_at_start = cgroup.host_oom_kills()
        fd, name = tempfile.mkstemp(prefix="seis-engine-", suffix=".log")
        self.stderr_path = Path(name)
        options = {**self.options, "device": self.options.get("device", "auto")}
        argv = [sys.executable, WORKER, "--engine-dir", ENGINE_MOUNT, "--model-dir", MODEL_MOUNT,
                "--options", json.dumps(options)]
        self._stderr_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "wb") as stderr:
            self.box = SandboxedProcess(argv, self.policy, stderr=stderr, forbidden=forbidden_paths())
            self.proc = self.box.start()
        self.watch = WriteWatch(self.box, self.policy, extra=[self.stderr_path], what="its compile cache and log")
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def pids(self) -> list[int]:
        """Every process of this engine's sandbox (host pids)."""
        return self.box.members() if self.box else []

    def _pump(self, stream) -> None:
        while line := stream.readline(MAX_REPLY_BYTES):
            if not line.endswith(b"\n") and len(line) >= MAX_REPLY_BYTES:
                self._lines.put(OVERSIZED)  # and stop reading: the engine is flooding its protocol stream
                return
            self._lines.put(line.decode("utf-8", errors="replace"))
        self._lines.put(None)

    def call(self, op: str, timeout_s: float | None = None, **payload) -> Any:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise self._exited(f"engine process is not running{_status(code)}", code)
        if not self._lines.empty():
            self._protocol_broken(f"the engine wrote to its reply stream before '{op}' was asked")
        rid = secrets.token_hex(16)  # unpredictable: no reply can be written before its request exists
        try:
            self.proc.stdin.write((json.dumps({"op": op, "id": rid, **payload}) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EngineError(f"engine process closed its input before '{op}'{self._stderr_tail()}") from None
        try:
            line = self._lines.get(timeout=timeout_s or self.timeout_s)
        except queue.Empty:
            self.kill()
            raise EngineTimeout(f"engine did not answer '{op}' within {timeout_s or self.timeout_s:.0f} s") from None
        if line is None:
            if self.watch is not None:
                self.watch.stop()  # if it killed the engine, its kill is over: nothing of the sandbox is left
            code = self._exit_status()
            raise self._exited(f"engine process exited during '{op}'{_status(code)}", code)
        if line is OVERSIZED:
            self._protocol_broken(f"reply to '{op}' is longer than {MAX_REPLY_BYTES // 2**20} MiB")
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
            self._protocol_broken(f"unreadable reply to '{op}': {line[:200]!r}")
        if not isinstance(reply, dict) or reply.get("id") != rid:
            self._protocol_broken(f"reply does not answer the current '{op}' request (stale, repeated or forged)")
        if not reply.get("ok"):
            raise EngineError(error_text(reply.get("error")))
        return reply.get("result")

    # Typed conveniences over `call` (timeout_s: this call's limit, default the instance's).
    def build(self, timeout_s: float | None = None) -> dict:
        """The build reply; its "stats" as plain_stats keeps them."""
        reply = self.call("build", timeout_s=timeout_s)
        if isinstance(reply, dict) and "stats" in reply:
            reply = {**reply, "stats": plain_stats(reply["stats"])}
        return reply

    def generate(self, prompts: list[list[int]], sampling: Sampling | list[Sampling],
                 timeout_s: float | None = None) -> list[dict]:
        """The reply as bounded_generations keeps it (so do score and verify: bounded_scores)."""
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        reply = self.call("generate", timeout_s=timeout_s, prompts=prompts, sampling=[asdict(p) for p in params])
        return bounded_generations(reply, params)

    def score(self, prompts, continuations, top_k: int = 5, timeout_s: float | None = None) -> list[dict]:
        reply = self.call("score", timeout_s=timeout_s, prompts=prompts, continuations=continuations, top_k=top_k)
        return bounded_scores(reply, continuations, top_k)

    def verify(self, prefixes, drafts, top_k: int = 5, timeout_s: float | None = None) -> list[dict]:
        reply = self.call("verify", timeout_s=timeout_s, prompts=prefixes, continuations=drafts, top_k=top_k)
        return bounded_scores(reply, drafts, top_k)

    def stats(self, timeout_s: float | None = None) -> dict:
        return plain_stats(self.call("stats", timeout_s=timeout_s))

    def close(self) -> None:
        """End the engine's whole sandbox (nothing of it needs a graceful exit) and drop its log."""
        if self.watch is not None:
            self.watch.stop()
        self.kill()
        if self.stderr_path:
            self.stderr_path.unlink(missing_ok=True)
        if self._stderr_fd is not None:
            os.close(self._stderr_fd)
            self._stderr_fd = None

    def _protocol_broken(self, message: str) -> NoReturn:
        """An engine that breaks the one-reply-per-request protocol is not asked anything again: it is killed."""
        self.kill()
        raise EngineError(message)

    def kill(self) -> None:
        """End every process of the engine's sandbox; returns once none is left."""
        if self.box is not None:
            self.box.kill()

    def _exit_status(self, wait_s: float = 5.0) -> int | None:
        """The exit status once stdout has closed (the process may need a moment to be reaped)."""
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def _exited(self, message: str, code: int | None) -> EngineExited:
        now = cgroup.host_oom_kills()
        host_oom = None if now is None or self._oom_kills_at_start is None else now > self._oom_kills_at_start
        bound = self.box.memory_bound_reached() if self.box is not None else None
        return EngineExited(f"{message}{self._watch_note()}{f' ({bound})' if bound else ''}{self._stderr_tail()}",
                            code, host_oom, watch_killed=self.watch is not None and self.watch.exceeded is not None,
                            bound_oom=bound is not None)

    def _watch_note(self) -> str:
        return f" ({self.watch.exceeded})" if self.watch is not None and self.watch.exceeded else ""

    def _stderr_tail(self, n: int = 1500) -> str:
        """The log's last n bytes, read through the descriptor this process opened when it made the file: no
        path is looked up again, so nothing put in the log's place (a link to a host file) is ever read."""
        if self._stderr_fd is None:
            return ""
        size = os.fstat(self._stderr_fd).st_size
        tail = os.pread(self._stderr_fd, n, max(0, size - n)).decode("utf-8", errors="replace").strip()
        return f"; its stderr ends:\n{tail}" if tail else ""


def _status(code: int | None) -> str:
    if code is None:
        return ""
    if code in (-9, 137):
        return " (killed by SIGKILL)"
    return f" (killed by signal {-code})" if code < 0 else f" (exit status {code})"
