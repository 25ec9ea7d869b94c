"""Who inherits from whom: each chain's latest retained engine and its reports; fan-in at sync points."""
from __future__ import annotations

from collections.abc import Collection
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


def ranked_speedup(outcome: SessionOutcome, noisy: Collection[tuple[str, int]] = ()) -> float | None:
    """What the best-engine pick ranks an engine by: its dev speedup over vanilla, or 1.0 (no gain shown) where
    its own gate could not tell it from vanilla (`noisy` holds (chain, session); see progress.within_noise)."""
    if outcome.dev_speedup_vs_vanilla is None:
        return None
    return 1.0 if (outcome.chain, outcome.session) in noisy else outcome.dev_speedup_vs_vanilla


def pick_best(outcomes: list[SessionOutcome], noisy: Collection[tuple[str, int]] = ()) -> SessionOutcome | None:
    """The retained engine with the highest dev speedup over vanilla (ties: earliest), leaving out every engine
    from which a path of retained children, each at least as fast as its parent in its own gate, leads to one
    that no child outdid.

    Speedups over vanilla come from different gates, each with its own noise; a child's speedup over its parent
    comes from one gate that timed both. So a parent that its own retained child matched or beat in that one run
    is not the best, whatever the two gates' ratios over vanilla say. Engines on a loop of such steps (a later
    session returned to an earlier tree) with no way off it stay in the choice.

    Noise: an engine whose own gate could not tell its speed from vanilla's (`noisy`: the (chain, session) of
    such sessions, by progress.within_noise) ranks as 1.0x, whatever its ratio says, so a gain its gate did not
    show never outranks one it did, however small; an engine clearly slower than vanilla ranks below it. Among
    engines ranked alike (when no engine showed a gain: all those within noise) the ratio itself breaks the tie,
    then the earliest; best.json then says the pick is within noise (dev_speedup_within_noise)."""
    kept = [o for o in outcomes if o.retained and o.dev_speedup_vs_vanilla is not None]
    outdone_by = {(o.parent_snapshot, o.snapshot) for o in kept
                  if o.snapshot != o.parent_snapshot and (o.dev_speedup_vs_parent or 0.0) >= 1.0}
    unbeaten = {o.snapshot for o in kept} - {parent for parent, _ in outdone_by}
    leads_to_unbeaten = set(unbeaten)
    grew = True
    while grew:
        grew = False
        for parent, child in outdone_by:
            if child in leads_to_unbeaten and parent not in leads_to_unbeaten:
                leads_to_unbeaten.add(parent)
                grew = True
    left_out = leads_to_unbeaten - unbeaten
    return max((o for o in kept if o.snapshot not in left_out),
               key=lambda o: (ranked_speedup(o, noisy), o.dev_speedup_vs_vanilla), default=None)
