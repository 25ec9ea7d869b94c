"""The run configuration: one pydantic model that the `seis` flow takes as its parameters.

Everything is validated before any work starts; messages say what to fix.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .host import missing_device, runs_on_cuda

Protocol = Literal["branching", "chain", "sync-chain"]
AgentKind = Literal["offline", "anthropic", "openai", "cli"]
AGENTS_AVAILABLE = ("offline", "anthropic", "openai", "cli")   # the agents a session can make (session.steps)


class RunConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # no limit is None, not inf

    protocol: Protocol = Field(
        "sync-chain", description="branching (every session from E0), chain (each session inherits its chain's last "
                                  "retained engine) or sync-chain (chain, plus a fan-in every sync_every sessions)")
    agent: AgentKind = Field("offline", description="offline (the transformation library; no key or network), "
                                                    "anthropic, openai or cli (a headless coding agent)")
    chains: int = Field(2, ge=1, le=16, description="independent lineages (branching: parallel sessions per round)")
    sessions: int = Field(4, ge=1, le=100, description="sessions per chain")
    sync_every: int = Field(None, ge=1, le=100, description="sync-chain: a fan-in before every N-th session "
                                                            "(default: half the sessions, at least 1)")
    model: str = Field("tiny-qwen3", description="model name (seis models list) or a local HF directory")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where engines run: auto (cuda when a GPU is usable), cpu or cuda")
    gate: Literal["smoke", "quick", "full"] = Field(
        None, description="gate sizes: smoke (tests), quick (CPU-friendly) or full (default: full on CUDA, else "
                          "quick)")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="seed of the engines and the gate's sampled checks")
    objective: Literal["single", "throughput", "both", "none"] = Field(
        None, description="retain rule's speed half: not slower than the parent (per repetition, over vanilla's) "
                          "or than vanilla beyond noise on the one-at-a-time "
                          "dev workloads (single), the batched one (throughput), all (both; default on CUDA) or "
                          "none (the checks alone; default elsewhere, where timings say nothing of a GPU engine)")
    post_validate: Literal["off", "quick", "full"] = Field(
        "off", description="after the run: post-validate the best retained engine against vanilla")
    max_transformations: int = Field(1, ge=0, le=100, description="offline agent: new changes per session")
    max_tokens: int | None = Field(None, ge=1, description="LLM agents: token budget per session")
    max_cost_usd: float | None = Field(None, gt=0, description="LLM agents: cost budget per session")
    out: Path = Field(default_factory=lambda: Path("runs") / time.strftime("%Y%m%d-%H%M%S"),
                      description="run directory, new or empty (default: runs/<time>)")
    base_engine: Path | None = Field(None, description="the vanilla engine (default: engine_template/)")
    agent_library: Path | None = Field(None, description="offline agent: a transformation library directory")
    # LLM agents (anthropic | openai | cli). Keys come from the SDKs' env vars (ANTHROPIC_API_KEY, OPENAI_API_KEY)
    # and never enter the config. The two env defaults let `seis evolve --agent cli` be configured without flags.
    agent_model: str | None = Field(default_factory=lambda: os.environ.get("SEIS_AGENT_MODEL") or None,
                                    description="LLM agents: model name (default per backend; env SEIS_AGENT_MODEL)")
    agent_base_url: str | None = Field(None, description="LLM agents: API base URL (default: the SDK's env var "
                                                         "ANTHROPIC_BASE_URL / OPENAI_BASE_URL, then its default)")
    agent_command: str | None = Field(default_factory=lambda: os.environ.get("SEIS_AGENT_COMMAND") or None,
                                      description="cli agent: bash command line run in the workspace, prompt on "
                                                  "stdin (env SEIS_AGENT_COMMAND)")
    max_turns: int = Field(50, ge=1, le=10_000, description="LLM agents: API calls per session")
    prompt_template: str = Field("session_v1", min_length=1,
                                 description="LLM agents: a bundled prompt template name or a file path")
    agent_prices: dict[str, tuple[float, ...]] = Field(
        default_factory=dict, description="LLM agents: model prefix -> (USD/Mtok in, out) or (in, out, cache read, "
                                          "cache write); key 'default' prices unknown models (else they cost $0, "
                                          "with a note)")
    agent_max_retries: int = Field(4, ge=0, le=20, description="LLM agents: SDK retries on 429 / 5xx")
    agent_wall_s: float | None = Field(None, gt=0, description="LLM agents: wall-clock limit per session")
    agent_network: Literal["none", "api", "host"] = Field(
        "none", description="cli agent: its sandbox's network: none (loopback only), api (only its API endpoints, "
                            "through a SEIS proxy) or host (the host's whole network; an explicit opt-in)")
    agent_api_endpoints: list[str] = Field(
        default_factory=list, description="cli agent, agent_network=api: host:port (or URLs) it may reach (default: "
                                          "agent_base_url, else the official API of the key it is passed)")
    agent_pass_env: list[str] = Field(
        default_factory=list, description="cli agent: names of environment variables handed to the cli process "
                                          "(its own API key); never to a dev benchmark or an SDK agent's shell")
    store: Path = Field(Path("store"), description="snapshot store (DVC-tracked when inside a DVC repo)")
    dispatch: Literal["local", "workers"] = Field(
        "local", description="where sessions run: local (threads of this flow run) or workers (one `seis-session` "
                             "flow run per session on a work pool; needs a Prefect server and a shared DVC remote)")
    session_deployment: str = Field(
        "seis-session/cuda", pattern=r"^[^/]+/[^/]+$",
        description="dispatch=workers: the session deployment (flow/deployment), e.g. seis-session/cpu")

    @model_validator(mode="before")
    @classmethod
    def _gate_for_device(cls, values):
        """Unless chosen, the gate is the full one on CUDA (speed ratios that mean something), quick elsewhere, and
        the objective likewise "both" on CUDA, "none" elsewhere."""
        if isinstance(values, dict):
            cuda = runs_on_cuda(values.get("device", "auto"))
            if values.get("gate") is None:
                values = {**values, "gate": "full" if cuda else "quick"}
            if values.get("objective") is None:
                values = {**values, "objective": "both" if cuda else "none"}
        return values

    @model_validator(mode="before")
    @classmethod
    def _sync_every_for_sessions(cls, values):
        """Unless chosen, sync_every follows sessions, so that overriding sessions alone never makes it too large."""
        if isinstance(values, dict) and values.get("sync_every") is None:
            values = {k: v for k, v in values.items() if k != "sync_every"}
            try:   # sessions as given ("6" too); one that is not a count is reported alone
                sessions = int(values.get("sessions", cls.model_fields["sessions"].default))
            except (TypeError, ValueError):
                return values
            values["sync_every"] = default_sync_every(sessions)
        return values

    @field_validator("out", "store")
    @classmethod
    def _absolute(cls, out: Path) -> Path:  # noqa: D401 - also used for the store path
        return out.expanduser().resolve()

    @field_validator("base_engine", "agent_library")
    @classmethod
    def _absolute_if_given(cls, path: Path | None) -> Path | None:
        """Recorded absolute, as out and store are: a run resumed from another working directory uses the same."""
        return None if path is None else path.expanduser().resolve()

    @field_validator("model")
    @classmethod
    def _model_dir_absolute(cls, model: str) -> str:
        """A local model directory (not a model name) is recorded absolute, for the same reason."""
        from .models.registry import REGISTRY
        path = Path(model).expanduser()
        return model if model in REGISTRY or not path.is_dir() else str(path.resolve())

    @field_validator("prompt_template")
    @classmethod
    def _template_file_absolute(cls, template: str) -> str:
        """A template file (not a bundled name) is recorded absolute, for the same reason."""
        path = Path(template).expanduser()
        return str(path.resolve()) if path.is_file() else template

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        if self.protocol == "sync-chain" and self.sync_every > self.sessions:
            raise ValueError(f"sync_every ({self.sync_every}) must not exceed sessions ({self.sessions}): "
                             "no sync would ever happen; leave sync_every unset for half the sessions")
        if self.protocol == "sync-chain" and self.chains < 2:
            raise ValueError("sync-chain needs at least 2 chains to sync between")
        if self.agent == "cli" and not (self.agent_command or "").strip():
            raise ValueError("agent 'cli' needs agent_command (or SEIS_AGENT_COMMAND): the command line of a "
                             "headless coding agent, e.g. 'claude -p --permission-mode acceptEdits'")
        if any(p < 0 for prices in self.agent_prices.values() for p in prices):
            raise ValueError("agent_prices must be >= 0 (USD per million tokens)")
        if any(len(prices) not in (2, 4, 5) for prices in self.agent_prices.values()):
            raise ValueError("agent_prices entries are (in, out) or (in, out, cache_read, cache_write[, "
                             "cache_write_1h]) in USD per million tokens")
        if self.agent != "cli" and (self.agent_network != "none" or self.agent_pass_env or self.agent_api_endpoints):
            raise ValueError("agent_network, agent_pass_env and agent_api_endpoints apply to the cli agent only")
        return self

    def preflight(self, resume: bool = False, resume_hint: str = "--resume {out}") -> None:
        """Checks that touch the machine (output dir, model), run once before any work starts. `resume`: the
        output dir holds this run already (it is continued); else it must be new or empty, and the refusal
        names `resume_hint` (the CLI flag, or the flow parameter in a Prefect context; `{out}`: the dir)."""
        from .models import ModelError, resolve_model

        if self.agent not in AGENTS_AVAILABLE:
            raise ValueError(f"agent {self.agent!r} is not available yet (available: {', '.join(AGENTS_AVAILABLE)})")
        self._check_device()
        if self.agent != "offline":  # API key by env var name, cli command, prompt template: before any work
            from .agents.llm import check_ready, settings_from_config
            check_ready(settings_from_config(self), max_cost_usd=self.max_cost_usd)
        try:
            resolve_model(self.model)
        except ModelError as e:
            raise ValueError(str(e)) from None
        if self.agent_library is not None:
            from .agents.offline.library import load_library
            if not self.agent_library.is_dir():
                raise ValueError(f"agent library {self.agent_library} is not a directory")
            if not load_library(self.agent_library):  # raises with the offending transformation named
                raise ValueError(f"agent library {self.agent_library} holds no transformations (a directory each, "
                                 f"with meta.yaml or meta.json): every session would end in no_change")
        if self.base_engine is not None:
            from .engine_import import check_engine_dir
            check_engine_dir(self.base_engine)
        self._check_store()
        self._check_out_dir(resume, resume_hint)

    def _check_device(self) -> None:
        """device=cuda needs a CUDA GPU on this machine (not with dispatch=workers: the sessions then run on the
        workers' devices); without one every session would only end in an error."""
        if self.device != "cuda" or self.dispatch == "workers":
            return
        why = missing_device(self.device)
        if why:
            raise ValueError(f"device cuda was asked for, but {why} (torch.cuda.is_available() is False): run on "
                             f"a GPU host, or use device cpu or auto")

    def _check_store(self) -> None:
        """The snapshot store is a directory, or can be made one, and is writable (nothing made here)."""
        from .writable import unwritable
        if (problem := unwritable(self.store, "store")) is not None:
            raise ValueError(problem)

    def _check_out_dir(self, resume: bool, resume_hint: str) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise ValueError(f"output path {out} exists and is not a directory")
        if not resume and out.exists() and any(p.name != ".prefect" for p in out.iterdir()):  # .prefect: its state
            what = "holds a run" if (out / "config.json").is_file() else "is not empty"
            raise ValueError(f"output dir {out} {what}; continue it with {resume_hint.format(out=out)}, or choose "
                             f"a new output dir")
        from .writable import unwritable
        if (problem := unwritable(out, "output dir")) is not None:
            raise ValueError(problem)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"output dir {out} cannot be created: {e.strerror}") from None

    @property
    def run_id(self) -> str:
        return self.out.name

    def chain_ids(self) -> list[str]:
        return [f"c{i}" for i in range(self.chains)]

    def is_sync_point(self, session: int) -> bool:
        """Sync-chain: a fan-in happens before sessions N, 2N, ... (0-based session index)."""
        return self.protocol == "sync-chain" and session > 0 and session % self.sync_every == 0


def default_sync_every(sessions: int) -> int:
    """Half the sessions, at least 1: one fan-in halfway through (Sync-3 for 6 sessions, every session for 2)."""
    return max(1, sessions // 2)
