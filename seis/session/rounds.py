"""The protocols' round loop: which sessions run in each round, from which parent, after which fan-in, and what
each chain holds afterwards. Pure: everything that runs or reads something (the vanilla snapshot, a session, a
fan-in, what an earlier attempt recorded) goes through a SessionRunner; the `seis` flow's runner is Prefect tasks.

Every round (session index) of every chain, in order:
1. resume: a session an earlier attempt finished is kept when it still follows from the run's state
   (resume.still_valid: the same parent; no earlier session it depends on redone), else it is redone; which ones
   are kept is decided before any session runs (standing_outcomes), and the others stop counting as done;
2. before every N-th session (sync-chain), if any session of the round is to run, the fan-in: it gets every
   chain's state after the previous round and hands each chain what its session then starts with;
3. the round's sessions run together, each from its parent (branching: vanilla; chain, sync-chain: its chain's
   latest retained engine, protocol.session_spec);
4. each chain's state takes its session's outcome (retained or not: ChainState.after). A session that reached
   no outcome is a failure: the round's other sessions are still counted, and the run stops after that round.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ..run_config import RunConfig
from .lineage import ChainState
from .protocol import initial_states, upstream_is_vanilla
from .resume import still_valid
from .spec import SessionOutcome, SessionResult


class SessionRunner(Protocol):
    """What the round loop needs run. `peers` is whatever `fan_in` returned (per chain, what its session is handed:
    engines and reports in-process, snapshot refs on workers); the loop only passes it on."""

    def pin_vanilla(self) -> str:
        """The run's vanilla snapshot (E0), before any session."""

    def recorded(self, chain: str, session: int) -> SessionOutcome | None:
        """Resume: the session's outcome if an earlier attempt finished it, else None."""

    def fan_in(self, states: dict[str, ChainState], session: int) -> Mapping[str, object]:
        """After every chain's latest session: hand each chain all of its peers' latest retained engines and
        reports (states: every chain's state after the previous round)."""

    def run_sessions(self, session: int, chains: list[str], vanilla: str, states: dict[str, ChainState],
                     peers: Mapping[str, object]) -> dict[str, SessionResult]:
        """Run these chains' sessions of the round together (each from what `states` and `peers` give it, after
        its chain's previous session and the round's fan-in) and wait for all; one result per chain, a failure
        where a session reached no outcome."""

    def show_recorded(self, outcome: SessionOutcome) -> None:
        """A session an earlier attempt finished is kept: show it in this run as it was shown there."""

    def keep_only(self, kept: set[tuple[str, int]]) -> None:
        """Resume, before any session runs: every recorded outcome but these (chain, session) is stale (its session
        is redone) and must no longer count as done."""


@dataclass(frozen=True)
class Rounds:
    """What the loop ends on."""
    vanilla: str
    outcomes: list[SessionOutcome]        # every session's, recorded ones included: round then chain order
    failures: list[str]                   # why sessions reached no outcome (the loop stopped after their round)
    states: dict[str, ChainState]         # every chain's state at the end


def parent_snapshot(config: RunConfig, vanilla: str, states: dict[str, ChainState], chain: str) -> str:
    """The engine a chain's next session starts from: vanilla (branching), else its latest retained engine (the
    rule of protocol.session_spec)."""
    return vanilla if upstream_is_vanilla(config) else states[chain].snapshot


def standing_outcomes(config: RunConfig, runner: SessionRunner, vanilla: str) -> dict[tuple[str, int], SessionOutcome]:
    """The recorded outcomes a resumed run keeps: the loop's own rule (resume.still_valid) applied round by round to
    the records alone. It needs nothing the redone sessions produce: once a chain has a session redone, none of its
    later records stands (chain; sync-chain: no chain's, through the fan-ins), whatever the redone one yields."""
    states = initial_states(config, vanilla)
    kept: dict[tuple[str, int], SessionOutcome] = {}
    redone: set[str] = set()
    for session in range(config.sessions):
        round_kept = {}
        for chain in config.chain_ids():
            outcome = runner.recorded(chain, session)
            if outcome is not None and still_valid(outcome, config.protocol,
                                                   parent_snapshot(config, vanilla, states, chain), redone):
                round_kept[chain] = outcome
        redone |= set(config.chain_ids()) - set(round_kept)   # after the round, as the loop adds them
        for chain, outcome in round_kept.items():
            kept[chain, session] = outcome
            states[chain] = states[chain].after(outcome)
    return kept


def run_rounds(config: RunConfig, runner: SessionRunner, resumed: bool = False) -> Rounds:
    """Every round in order: the recorded sessions kept (resume), the fan-in if due, the other sessions run, every
    chain's state updated; stops after the first round in which a session reached no outcome."""
    vanilla = runner.pin_vanilla()
    states = initial_states(config, vanilla)
    chains = config.chain_ids()
    outcomes: list[SessionOutcome] = []
    failures: list[str] = []
    kept: dict[tuple[str, int], SessionOutcome] = {}
    if resumed:
        # Decided up front, not round by round: until a stale outcome's round came, it was still on disk and
        # counted as done (status.json's sessions_done, the best so far), and a run interrupted again before that
        # round kept it on its next resume, when the redone session before it left the same parent snapshot.
        kept = standing_outcomes(config, runner, vanilla)
        runner.keep_only(set(kept))
    for session in range(config.sessions):
        recorded = {chain: kept[chain, session] for chain in chains if (chain, session) in kept}
        todo = [c for c in chains if c not in recorded]
        peers: Mapping[str, object] = {}
        if config.is_sync_point(session) and todo:
            peers = runner.fan_in(dict(states), session)
        results = runner.run_sessions(session, todo, vanilla, dict(states), peers) if todo else {}
        for chain in chains:
            if chain in recorded:
                outcome = recorded[chain]
                runner.show_recorded(outcome)
            else:
                result = results[chain]
                if result.outcome is None:
                    failures.append(result.failure)
                    continue
                outcome = result.outcome
            outcomes.append(outcome)
            states[chain] = states[chain].after(outcome)
        if failures:
            break
    return Rounds(vanilla, outcomes, failures, states)
