"""The run configuration: one pydantic model that the `seis` flow takes as its parameters.

Everything is validated before any work starts; messages say what to fix.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Protocol = Literal["branching", "chain", "sync-chain"]
AgentKind = Literal["offline", "anthropic", "openai", "cli"]


class RunConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    protocol: Protocol = "sync-chain"
    agent: AgentKind = "offline"
    chains: int = Field(2, ge=1, le=16, description="independent lineages (branching: parallel sessions per round)")
    sessions: int = Field(4, ge=1, le=100, description="sessions per chain")
    sync_every: int = Field(2, ge=1, description="sync-chain: a fan-in before every N-th session")
    model: str = Field("tiny-qwen3", description="model name (seis models list) or a local HF directory")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    gate: Literal["smoke", "quick", "full"] = Field(
        "quick", description="gate sizes: smoke (tests), quick (CPU-friendly) or full (GPU)")
    seed: int = 0
    max_transformations: int = Field(1, ge=0, description="offline agent: new changes per session")
    max_tokens: int | None = Field(None, ge=1, description="LLM agents: token budget per session")
    max_cost_usd: float | None = Field(None, gt=0, description="LLM agents: cost budget per session")
    out: Path = Field(default_factory=lambda: Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    base_engine: Path | None = Field(None, description="the vanilla engine (default: engine_template/)")
    agent_library: Path | None = Field(None, description="offline agent: a transformation library directory")
    store: Path = Field(Path("store"), description="snapshot store (DVC-tracked when inside a DVC repo)")

    @field_validator("out", "store")
    @classmethod
    def _absolute(cls, out: Path) -> Path:  # noqa: D401 - also used for the store path
        return out.expanduser().resolve()

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        if self.protocol == "sync-chain" and self.sync_every > self.sessions:
            raise ValueError(f"sync_every ({self.sync_every}) must not exceed sessions ({self.sessions}): "
                             "no sync would ever happen")
        if self.protocol == "sync-chain" and self.chains < 2:
            raise ValueError("sync-chain needs at least 2 chains to sync between")
        return self

    def preflight(self) -> None:
        """Checks that touch the machine (output dir, model), run once before any work starts."""
        from .models import ModelError, resolve_model

        from .session.steps import AGENTS_AVAILABLE
        if self.agent not in AGENTS_AVAILABLE:
            raise ValueError(f"agent {self.agent!r} is not available yet (available: {', '.join(AGENTS_AVAILABLE)})")
        try:
            resolve_model(self.model)
        except ModelError as e:
            raise ValueError(str(e)) from None
        if self.agent_library is not None:
            from .agents.offline.library import load_library
            if not self.agent_library.is_dir():
                raise ValueError(f"agent library {self.agent_library} is not a directory")
            load_library(self.agent_library)  # raises with the offending transformation named
        if self.base_engine is not None:
            from .engine_import import check_engine_dir
            check_engine_dir(self.base_engine)
        self._check_out_dir()

    def _check_out_dir(self) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise ValueError(f"output path {out} exists and is not a directory")
        if out.exists() and any(out.iterdir()):
            raise ValueError(f"output dir {out} is not empty; choose a new --out")
        existing = next(p for p in [out, *out.parents] if p.exists())
        if not existing.is_dir():
            raise ValueError(f"output dir {out} cannot be created: {existing} is not a directory (not writable)")
        try:  # the only reliable writability test (root passes every os.access check)
            out.mkdir(parents=True, exist_ok=True)
            (out / ".write-test").touch()
            (out / ".write-test").unlink()
        except OSError as e:
            raise ValueError(f"output dir {out} is not writable: {e.strerror}") from None

    @property
    def run_id(self) -> str:
        return self.out.name

    def chain_ids(self) -> list[str]:
        return [f"c{i}" for i in range(self.chains)]

    def is_sync_point(self, session: int) -> bool:
        """Sync-chain: a fan-in happens before sessions N, 2N, ... (0-based session index)."""
        return self.protocol == "sync-chain" and session > 0 and session % self.sync_every == 0
