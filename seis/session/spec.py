"""A session as data: what the protocol hands it, and what it hands back."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from ..workspace import PeerMaterial, Report


@dataclass(frozen=True)
class SessionSpec:
    run_id: str
    chain: str
    chain_index: int
    session: int
    parent_snapshot: str
    session_dir: Path                                    # runs/<id>/chains/<chain>/<session>/
    vanilla_snapshot: str = ""                           # the run's vanilla (base engine) in the store
    inherited: tuple[Report, ...] = ()                   # this chain's earlier reports, oldest first
    peers: tuple[PeerMaterial, ...] = ()                 # at a sync: every other chain's latest retained engine
    synced_from: tuple[str, ...] = field(default_factory=tuple)
    device_slot: str = ""                                # dispatch=workers: the device its worker owns ('' = none)


@dataclass(frozen=True)
class SessionOutcome:
    chain: str
    session: int
    parent_snapshot: str
    snapshot: str                 # the chain's engine after this session (the parent's when not retained)
    retained: bool
    verdict: str                  # pass | fail | no_change | error
    reasons: tuple[str, ...]      # failed checks, or why no gate ran
    dev_speedup_vs_vanilla: float | None
    dev_speedup_vs_parent: float | None
    synced_from: tuple[str, ...]
    agent: str
    applied: tuple[str, ...]
    adopted: tuple[str, ...]
    tokens_in: int
    tokens_out: int
    cost_usd: float
    wall_s: float
    report: Report

    def summary_row(self) -> dict:
        return {
            "chain": self.chain, "session": self.session, "parent_snapshot": self.parent_snapshot,
            "snapshot": self.snapshot, "retained": self.retained, "verdict": self.verdict,
            "reasons": "; ".join(self.reasons), "dev_speedup_vs_vanilla": self.dev_speedup_vs_vanilla,
            "dev_speedup_vs_parent": self.dev_speedup_vs_parent, "synced_from": ",".join(self.synced_from),
            "agent": self.agent, "applied": ",".join(self.applied), "adopted": ",".join(self.adopted),
            "tokens_in": self.tokens_in, "tokens_out": self.tokens_out, "cost_usd": self.cost_usd,
            "wall_s": round(self.wall_s, 2),
        }

    def to_dict(self) -> dict:
        """Everything, the report included: what `outcome.json` records so that a resumed run need not redo it."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "report"},
                "report": self.report.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "SessionOutcome":
        tuples = {"reasons", "synced_from", "applied", "adopted"}
        values = {f.name: (tuple(d[f.name]) if f.name in tuples else d[f.name]) for f in fields(cls)
                  if f.name != "report"}
        return cls(**values, report=Report.from_dict(d["report"]))


@dataclass(frozen=True)
class SessionResult:
    """What a session task hands the flow: its outcome, or why it reached none (the host failed, a step timed
    out). A session without an outcome is not recorded, so a resumed run redoes it."""
    chain: str
    session: int
    outcome: SessionOutcome | None = None
    failure: str = ""

    def __post_init__(self) -> None:
        if (self.outcome is None) == (not self.failure):
            raise ValueError("a session result holds either an outcome or a failure")
