"""Parent-process side: start a worker, send requests, enforce time limits, never share memory with the engine."""
from __future__ import annotations

import json
import os
import queue
import resource
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..engine_import import check_engine_dir


class EngineError(RuntimeError):
    """The engine raised, crashed, or answered something unreadable."""


class EngineTimeout(EngineError):
    """The engine did not answer in time; its process was killed."""


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
    """One engine in one child process. Use as a context manager; `call` ops mirror CONTRACT.md.

    Optional isolation, for callers that run untrusted engines: `base_env` replaces the inherited environment
    (`env` is still layered on top), `launcher` prefixes the command (e.g. ["unshare", "--net"]) and `rlimits`
    ({resource.RLIMIT_AS: bytes, ...}) is applied in the child before it execs.
    """

    def __init__(self, engine_dir: str | Path, model_dir: str | Path, options: dict | None = None,
                 timeout_s: float = 600.0, env: dict[str, str] | None = None, *,
                 base_env: Mapping[str, str] | None = None, launcher: Sequence[str] = (),
                 rlimits: Mapping[int, int] | None = None):
        self.engine_dir = check_engine_dir(engine_dir)
        self.model_dir = Path(model_dir)
        self.options = options or {}
        self.timeout_s = timeout_s
        self.env = env
        self.base_env = base_env
        self.launcher = tuple(launcher)
        self.rlimits = dict(rlimits or {})
        self.proc: subprocess.Popen | None = None
        self.stderr_path: Path | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    def __enter__(self) -> "EngineProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        fd, name = tempfile.mkstemp(prefix="seis-engine-", suffix=".log")
        self.stderr_path = Path(name)
        base = os.environ if self.base_env is None else self.base_env
        env = {**base, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                          env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [*self.launcher, sys.executable, "-m", "seis.engine_host.worker", "--engine-dir", str(self.engine_dir),
             "--model-dir", str(self.model_dir), "--options", json.dumps(self.options)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=fd, text=True, env=env,
            cwd=tempfile.gettempdir(), start_new_session=True,
            preexec_fn=_rlimit_setter(self.rlimits) if self.rlimits else None)
        os.close(fd)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def call(self, op: str, timeout_s: float | None = None, **payload) -> Any:
        if self.proc is None or self.proc.poll() is not None:
            raise EngineError(f"engine process is not running{self._stderr_tail()}")
        self.proc.stdin.write(json.dumps({"op": op, **payload}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout_s or self.timeout_s)
        except queue.Empty:
            self.kill()
            raise EngineTimeout(f"engine did not answer '{op}' within {timeout_s or self.timeout_s:.0f} s") from None
        if line is None:
            raise EngineError(f"engine process exited during '{op}'{self._stderr_tail()}")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise EngineError(f"unreadable reply to '{op}': {line[:200]!r}") from None
        if not reply.get("ok"):
            raise EngineError(reply.get("error", "unknown engine error"))
        return reply["result"]

    # Typed conveniences over `call` (timeout_s: this call's limit, default the instance's).
    def build(self, timeout_s: float | None = None) -> dict:
        return self.call("build", timeout_s=timeout_s)

    def generate(self, prompts: list[list[int]], sampling: Sampling | list[Sampling],
                 timeout_s: float | None = None) -> list[dict]:
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        return self.call("generate", timeout_s=timeout_s, prompts=prompts, sampling=[asdict(p) for p in params])

    def score(self, prompts, continuations, top_k: int = 5, timeout_s: float | None = None) -> list[dict]:
        return self.call("score", timeout_s=timeout_s, prompts=prompts, continuations=continuations, top_k=top_k)

    def verify(self, prefixes, drafts, top_k: int = 5, timeout_s: float | None = None) -> list[dict]:
        return self.call("verify", timeout_s=timeout_s, prompts=prefixes, continuations=drafts, top_k=top_k)

    def stats(self, timeout_s: float | None = None) -> dict:
        return self.call("stats", timeout_s=timeout_s)

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.call("shutdown", timeout_s=10)
                self.proc.wait(timeout=10)
            except (EngineError, OSError, subprocess.TimeoutExpired):
                self.kill()
        if self.stderr_path:
            self.stderr_path.unlink(missing_ok=True)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def _stderr_tail(self, n: int = 1500) -> str:
        if self.stderr_path and self.stderr_path.exists():
            tail = self.stderr_path.read_text(errors="replace")[-n:].strip()
            return f"; its stderr ends:\n{tail}" if tail else ""
        return ""


def _rlimit_setter(limits: Mapping[int, int]):
    """A preexec_fn that only calls setrlimit (safe between fork and exec)."""
    items = []
    for which, value in limits.items():  # never ask for more than the current hard limit allows
        hard = resource.getrlimit(which)[1]
        items.append((which, value if hard == resource.RLIM_INFINITY else min(value, hard)))

    def apply() -> None:
        for which, value in items:
            resource.setrlimit(which, (value, value))
    return apply
