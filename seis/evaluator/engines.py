"""Engines as the gate sees them: one isolated process per engine, a shared wall-clock deadline, replies
validated before use, and failures attributed (the reference's stop the gate; the candidate's become checks)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError

from ..engine_host import EngineError, EngineExited, EngineProcess, EngineTimeout
from ..engine_host.client import Sampling
from ..sandbox import SandboxError
from .errors import HostFailure, ReferenceEngineFailure, ReferenceFailure
from .isolation import Isolation


class GenerationOut(BaseModel):
    model_config = ConfigDict(frozen=True)
    token_ids: list[StrictInt]
    finish_reason: str


# A log-probability: at most 0 (a little above for rounding); NaN and +inf fail the bound, -inf (a probability of
# 0) passes. An engine's reply is data: +inf in its top-k made the KL check's sum -inf, which it clamps to 0.
LogProb = Annotated[float, Field(le=1e-3)]


class ScoreOut(BaseModel):
    model_config = ConfigDict(frozen=True)
    token_logprobs: list[LogProb]
    top_ids: list[list[StrictInt]]
    top_logprobs: list[list[LogProb]]


MAX_EOS_IDS = 64  # a model has one to a few


class BuildOut(BaseModel):
    """What the gate keeps of a build reply: the EOS ids (the reference's define the EOS checks) and the plain
    stats; whatever else the reply holds is dropped, and a reply that is no such mapping is malformed."""
    model_config = ConfigDict(frozen=True)
    eos_token_ids: list[StrictInt] = Field(max_length=MAX_EOS_IDS)
    stats: dict[str, Any] = Field(default_factory=dict)


_BUILD = TypeAdapter(BuildOut)
_GENERATIONS = TypeAdapter(list[GenerationOut])
_SCORES = TypeAdapter(list[ScoreOut])


@dataclass(frozen=True)
class Failure:
    op: str
    message: str
    timeout: bool = False

    def __str__(self) -> str:
        return f"{self.op}: {self.message}"


class Deadline:
    """The whole gate's wall-clock budget; every call gets min(its own limit, what is left)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def limit(self, per_call_s: float) -> float:
        return min(per_call_s, self.end - time.monotonic())

    def give_back(self, seconds: float) -> None:
        """Move the end later by time spent on an engine that has a budget of its own (the parent)."""
        self.end += seconds


class EngineHandle:
    """One engine process. `trusted` engines (the reference) raise ReferenceEngineFailure on any problem, and keep
    the calls they were made (`made`, so that `again()` can replay them); an untrusted one (candidate, parent)
    records a problem in `failures` and returns None, so the gate can keep judging."""

    def __init__(self, role: str, engine_dir: Path, model_dir: Path, options: dict, isolation: Isolation,
                 deadline: Deadline, build_timeout_s: float, call_timeout_s: float, trusted: bool,
                 cache_dir: Path | None = None, shared: Deadline | None = None):
        # the same engine in a fresh process, with a deadline as long as this one's was
        self.again = lambda: EngineHandle(role, engine_dir, model_dir, options, isolation, Deadline(deadline.seconds),
                                          build_timeout_s, call_timeout_s, trusted, cache_dir)
        self.made: list[tuple[str, tuple]] = []
        self.role, self.trusted, self.deadline = role, trusted, deadline
        # shared: the other engines' deadline, where this one's is its own; what its calls take is given back there
        self.shared = shared
        self.build_timeout_s, self.call_timeout_s = build_timeout_s, call_timeout_s
        self.proc = EngineProcess(engine_dir, model_dir, options, timeout_s=call_timeout_s, env=isolation.env,
                                  memory_bytes=isolation.memory_limit_bytes, cache_dir=cache_dir,
                                  sandbox_memory_bytes=isolation.sandbox_memory_bytes)
        self.failures: list[Failure] = []
        self.timed_out = False
        self.build_info: BuildOut | None = None
        self.calls = 0

    @property
    def usable(self) -> bool:
        return self.build_info is not None and not self.timed_out and self.proc.proc is not None \
            and self.proc.proc.poll() is None

    @property
    def _ended_unexplained(self) -> bool:
        """An untrusted engine that built and has since ended on its own, with no failure of it recorded."""
        return not (self.usable or self.trusted or self.build_info is None or self.timed_out or self.failures)

    def running(self) -> bool:
        """`usable`, for deciding whether to ask the engine more. An engine that ended unexplained gets its ending
        recorded first (by a call, which finds it gone and attributes the exit as any call does): whatever is
        skipped because an engine is gone is explained by a failed check, never passed over."""
        if self._ended_unexplained:
            self.stats()
        return self.usable

    def pids(self) -> list[int]:
        """Every process of this engine's sandbox."""
        return self.proc.pids()

    def freeze(self) -> None:
        """Stop the engine's sandbox while another engine is timed. One whose processes do not stay stopped (they
        resume each other) could run beside the timed engine: it is killed, and fails (the reference's stops the
        gate)."""
        if self.proc.box is None:
            return
        try:
            self.proc.box.freeze()
        except SandboxError as e:
            self.proc.kill()
            if self.trusted:  # no call of its own failed: nothing to replay
                raise ReferenceFailure(f"the {self.role} engine could not be frozen: {e}") from None
            self._fail("freeze", str(e))

    def thaw(self) -> None:
        """Resume the engine's sandbox. One whose processes ran while it was frozen (one of them had the kernel
        resume it) may have run beside the timed engine: it is killed, and fails (the reference's stops the
        gate)."""
        if self.proc.box is None or not self.proc.box.thaw():
            return
        self.proc.kill()
        message = "its processes ran while it was frozen for another engine's timed request"
        if self.trusted:
            raise ReferenceFailure(f"the {self.role} engine: {message}")
        self._fail("freeze", message)

    def start(self) -> None:
        self.proc.start()

    def close(self) -> None:
        self.proc.close()

    def _call(self, op: str, fn, per_call_s: float, parse=None, args: tuple = ()):
        if self.trusted:
            self.made.append((op, args))
        if op != "build" and not self.usable:
            if self.trusted:
                raise ReferenceEngineFailure(f"the {self.role} engine is not running (before '{op}')")
            if not self._ended_unexplained:
                return None  # failed to build, timed out or failed a call earlier: that failure is recorded
            # it ended on its own since its last call: the call below finds it gone and records why
        limit = self.deadline.limit(per_call_s)
        self.calls += 1
        started = time.monotonic()
        try:
            if limit <= 0:
                raise EngineTimeout(f"the gate's time budget ({self.deadline.seconds:.0f} s) ran out before '{op}'")
            reply = fn(limit)
            return parse(reply) if parse else reply
        except EngineTimeout as e:
            self.timed_out = True
            self.proc.kill()
            return self._fail(op, str(e), timeout=True)
        except EngineExited as e:
            if e.killed_by_host:  # SIGKILL while the OOM killer struck (timeouts are handled above): the host's
                raise HostFailure(f"the {self.role} engine was killed by the host during '{op}' (SIGKILL, no error "
                                  f"of its own; the kernel's OOM killer struck meanwhile): no verdict") from None
            if e.sigkilled and not e.watch_killed and not e.bound_oom:
                return self._fail(op, f"{e}; the kernel's OOM killer killed nothing on the host meanwhile: the "
                                      f"engine's own doing")
            return self._fail(op, str(e))
        except EngineError as e:
            return self._fail(op, str(e))
        except ValidationError as e:
            return self._fail(op, f"malformed reply: {e.errors()[0]['msg']} at {e.errors()[0]['loc']}")
        finally:
            if self.shared is not None:
                self.shared.give_back(time.monotonic() - started)

    def _fail(self, op: str, message: str, timeout: bool = False):
        if self.trusted:
            raise ReferenceEngineFailure(f"the {self.role} engine failed in '{op}': {message}")
        self.failures.append(Failure(op, message, timeout))
        return None

    def build(self) -> BuildOut | None:
        self.build_info = self._call("build", lambda t: self.proc.build(timeout_s=t), self.build_timeout_s,
                                     _BUILD.validate_python)
        return self.build_info

    def generate(self, prompts: list[list[int]], sampling: list[Sampling]) -> list[GenerationOut] | None:
        return self._call("generate", lambda t: self.proc.generate(prompts, sampling, timeout_s=t),
                          self.call_timeout_s, _GENERATIONS.validate_python, (prompts, sampling))

    def score(self, prompts: list[list[int]], continuations: list[list[int]], top_k: int) -> list[ScoreOut] | None:
        return self._call("score", lambda t: self.proc.score(prompts, continuations, top_k, timeout_s=t),
                          self.call_timeout_s, _SCORES.validate_python, (prompts, continuations, top_k))

    def verify(self, prefixes: list[list[int]], drafts: list[list[int]], top_k: int) -> list[ScoreOut] | None:
        return self._call("verify", lambda t: self.proc.verify(prefixes, drafts, top_k, timeout_s=t),
                          self.call_timeout_s, _SCORES.validate_python, (prefixes, drafts, top_k))

    def stats(self) -> dict | None:
        return self._call("stats", lambda t: self.proc.stats(timeout_s=t), self.call_timeout_s)

    def replay(self, made: list[tuple[str, tuple]]) -> None:
        """Make the calls another handle of this engine was made (its `made`), in order."""
        for op, args in made:
            getattr(self, op)(*args)


def start_and_build(handles: list[EngineHandle]) -> None:
    """Start every process, then build them concurrently (imports and weight loads overlap)."""
    for h in handles:
        h.start()
    with ThreadPoolExecutor(max_workers=len(handles)) as pool:
        for future in [pool.submit(h.build) for h in handles]:
            future.result()  # re-raises ReferenceEngineFailure
