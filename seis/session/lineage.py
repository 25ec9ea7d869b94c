"""Who inherits from whom: each chain's latest retained engine and its reports; fan-in at sync points."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..workspace import PeerMaterial, Report
from .spec import SessionOutcome


@dataclass(frozen=True)
class ChainState:
    chain: str
    snapshot: str                                  # latest retained engine of this chain
    reports: tuple[Report, ...] = field(default_factory=tuple)

    def after(self, outcome: SessionOutcome) -> "ChainState":
        return replace(self, snapshot=outcome.snapshot, reports=self.reports + (outcome.report,))


def fan_in(states: dict[str, ChainState], engine_dirs: dict[str, "object"]) -> dict[str, tuple[PeerMaterial, ...]]:
    """For every chain, all OTHER chains' latest retained code and their reports."""
    peers = {c: PeerMaterial(c, engine_dirs[c], s.reports) for c, s in states.items()}
    return {c: tuple(p for other, p in sorted(peers.items()) if other != c) for c in states}


def pick_best(outcomes: list[SessionOutcome]) -> SessionOutcome | None:
    """The retained engine with the highest dev speedup over vanilla (ties: earliest)."""
    kept = [o for o in outcomes if o.retained and o.dev_speedup_vs_vanilla is not None]
    return max(kept, key=lambda o: o.dev_speedup_vs_vanilla, default=None)
