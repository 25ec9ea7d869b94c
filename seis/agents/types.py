"""The agent interface: `edit(workspace, context) -> AgentResult`, the same for offline and LLM agents."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from ..workspace import PeerMaterial, Report, Workspace, check_chain_id

Status = Literal["edited", "no_change", "failed"]


@dataclass(frozen=True)
class Budget:
    """Limits of one session. Offline agents use the counts; LLM agents the token / cost / time limits."""

    max_transformations: int = 1      # new changes applied per session (adoptions at a sync not counted)
    max_attempts: int = 3             # changes tried per session, failed ones included
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_wall_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_transformations < 0 or self.max_attempts < 0:
            raise ValueError("budget counts must be >= 0")


@dataclass(frozen=True)
class SessionContext:
    """What the protocol hands an agent besides the workspace (which already holds the same material as files)."""

    chain: str
    session: int
    chain_index: int = 0              # position of the chain in the run: lets chains explore in different orders
    inherited_reports: tuple[Report, ...] = ()   # this chain's earlier sessions, retained and rejected, oldest first
    peers: tuple[PeerMaterial, ...] = ()         # non-empty only at a sync
    budget: Budget = field(default_factory=Budget)
    run_id: str | None = None
    # Where an agent may write its own artifacts (LLM agents: transcript.jsonl). None: the workspace's parent
    # directory, which prepare() makes the session directory.
    session_dir: Path | None = None

    def __post_init__(self) -> None:
        check_chain_id(self.chain)
        object.__setattr__(self, "inherited_reports", tuple(self.inherited_reports))
        object.__setattr__(self, "peers", tuple(self.peers))

    @property
    def is_sync(self) -> bool:
        return bool(self.peers)


@dataclass(frozen=True)
class Adoption:
    name: str          # the transformation (or change) taken over
    from_chain: str    # the peer chain it came from


@dataclass(frozen=True)
class Failure:
    name: str
    reason: str


@dataclass(frozen=True)
class AgentResult:
    agent: str
    status: Status                     # edited: the engine tree changed; no_change: nothing left to do; failed
    report_markdown: str               # Summary / Changes / Measurements (for the gate) / Lessons + seis-session block
    notes: str = ""                    # short free text for the run log
    applied: tuple[str, ...] = ()      # new changes this session
    attempted: tuple[str, ...] = ()    # everything tried, in order (applied, adopted and failed)
    adopted: tuple[Adoption, ...] = ()
    failed: tuple[Failure, ...] = ()
    model: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "AgentResult":
        d = dict(d)
        d["adopted"] = tuple(Adoption(**a) for a in d.get("adopted", ()))
        d["failed"] = tuple(Failure(**f) for f in d.get("failed", ()))
        for key in ("applied", "attempted"):
            d[key] = tuple(d.get(key, ()))
        return cls(**d)


@runtime_checkable
class Agent(Protocol):
    name: str

    def edit(self, workspace: Workspace, context: SessionContext) -> AgentResult:
        """Change the engine tree under workspace.root; return what was done and the report."""
        ...
