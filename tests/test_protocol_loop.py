"""The protocols' round loop (seis.session.rounds) with a fake runner: who each session starts from, what each
fan-in hands to whom, what a resumed run keeps, and what every chain ends on. No Prefect, no gates."""
from __future__ import annotations

from pathlib import Path

import pytest

from seis.run_config import RunConfig
from seis.session import ChainState, RunDir, SessionOutcome, SessionResult, run_rounds, session_spec
from seis.session.lineage import fan_in
from seis.workspace import Report

E0 = "E0"
RUN = RunDir(Path("/runs/r"))


def retained(chain: str, session: int) -> str:
    """The snapshot a retained session leaves (the fake's naming)."""
    return f"{chain}.s{session}"


def outcome(chain: str, session: int, parent: str, kept: bool, synced_from=()) -> SessionOutcome:
    verdict = "retained" if kept else "rejected"
    return SessionOutcome(
        chain=chain, session=session, parent_snapshot=parent, snapshot=retained(chain, session) if kept else parent,
        retained=kept, verdict="pass" if kept else "fail", reasons=(), dev_speedup_vs_vanilla=None,
        dev_speedup_vs_parent=None, synced_from=tuple(synced_from), agent="fake", applied=(), adopted=(),
        tokens_in=0, tokens_out=0, cost_usd=0.0, wall_s=0.0,
        report=Report(chain, session, f"{chain} s{session}", verdict))


class FakeRunner:
    """Records every call; a session's outcome is scripted by (chain, session): True (retained), False (rejected)
    or a string (no outcome: that failure); unscripted sessions are retained. Each session's spec comes from the
    real protocol rule (session_spec), as the flow's does; a fan-in is the real lineage.fan_in over fake dirs."""

    def __init__(self, config: RunConfig, script=None, recorded=None):
        self.config = config
        self.script = script or {}
        self.recorded_outcomes = recorded or {}
        self.calls: list[tuple] = []
        self.specs = {}                   # (chain, session) -> the SessionSpec it ran with
        self.fan_ins = {}                 # session -> the states it was handed
        self.shown: list[tuple[str, int]] = []

    def pin_vanilla(self) -> str:
        self.calls.append(("vanilla",))
        return E0

    def recorded(self, chain: str, session: int):
        return self.recorded_outcomes.get((chain, session))

    def fan_in(self, states, session):
        self.calls.append(("fan-in", session))
        self.fan_ins[session] = dict(states)
        return fan_in(states, {c: Path(f"/syncs/{session}/{c}") for c in states})

    def run_sessions(self, session, chains, vanilla, states, peers):
        self.calls.append(("sessions", session, tuple(chains)))
        results = {}
        for chain in chains:
            spec = session_spec(self.config, RUN, vanilla, states, peers, session, chain)
            self.specs[chain, session] = spec
            step = self.script.get((chain, session), True)
            if isinstance(step, str):
                results[chain] = SessionResult(chain, session, failure=step)
            else:
                results[chain] = SessionResult(chain, session, outcome=outcome(chain, session, spec.parent_snapshot,
                                                                               step, spec.synced_from))
        return results

    def show_recorded(self, outcome):
        self.shown.append((outcome.chain, outcome.session))

    def keep_only(self, kept):
        self.kept = set(kept)

    def parents(self) -> dict[tuple[str, int], str]:
        return {k: s.parent_snapshot for k, s in self.specs.items()}

    def ran(self) -> list[tuple[str, int]]:
        return [(c, call[1]) for call in self.calls if call[0] == "sessions" for c in call[2]]


def config(protocol: str, chains: int, sessions: int, **values) -> RunConfig:
    return RunConfig(protocol=protocol, chains=chains, sessions=sessions, out=RUN.root, **values)


def snapshots(states: dict[str, ChainState]) -> dict[str, str]:
    return {c: s.snapshot for c, s in states.items()}


def report_ids(reports) -> list[tuple[str, int]]:
    return [(r.chain, r.session) for r in reports]


def test_branching_sessions_all_start_from_vanilla_and_inherit_nothing():
    cfg = config("branching", chains=2, sessions=2)
    runner = FakeRunner(cfg, {("c1", 0): False, ("c0", 1): False})
    done = run_rounds(cfg, runner)
    assert runner.calls == [("vanilla",), ("sessions", 0, ("c0", "c1")), ("sessions", 1, ("c0", "c1"))]
    assert set(runner.parents().values()) == {E0}
    assert all(s.inherited == () and s.peers == () for s in runner.specs.values())
    # independent sessions spread over the agent's exploration orders
    assert sorted(s.chain_index for s in runner.specs.values()) == [0, 1, 2, 3]
    assert done.vanilla == E0 and not done.failures
    assert [(o.chain, o.session, o.retained) for o in done.outcomes] == [
        ("c0", 0, True), ("c1", 0, False), ("c0", 1, False), ("c1", 1, True)]
    # each chain's state takes its latest session's outcome: a rejected one's engine is its parent, vanilla
    assert snapshots(done.states) == {"c0": E0, "c1": "c1.s1"}
    assert report_ids(done.states["c0"].reports) == [("c0", 0), ("c0", 1)]


def test_chain_sessions_start_from_their_chains_latest_retained_engine_with_all_its_reports():
    cfg = config("chain", chains=2, sessions=3)
    runner = FakeRunner(cfg, {("c0", 1): False, ("c1", 0): False, ("c1", 2): False})
    done = run_rounds(cfg, runner)
    assert [c[0] for c in runner.calls] == ["vanilla", "sessions", "sessions", "sessions"]   # no fan-in
    assert runner.parents() == {
        ("c0", 0): E0, ("c0", 1): "c0.s0", ("c0", 2): "c0.s0",       # a rejected candidate keeps its parent
        ("c1", 0): E0, ("c1", 1): E0, ("c1", 2): "c1.s1"}
    assert report_ids(runner.specs["c0", 2].inherited) == [("c0", 0), ("c0", 1)]   # rejected ones too
    assert report_ids(runner.specs["c1", 1].inherited) == [("c1", 0)]
    assert all(s.peers == () and s.chain_index == int(s.chain[1:]) for s in runner.specs.values())
    assert snapshots(done.states) == {"c0": "c0.s2", "c1": "c1.s1"}
    assert [o.snapshot for o in done.outcomes if o.chain == "c1"] == [E0, "c1.s1", "c1.s1"]


def test_sync_chain_fans_in_before_every_nth_session_handing_each_chain_its_peers_latest():
    cfg = config("sync-chain", chains=3, sessions=4, sync_every=2)
    runner = FakeRunner(cfg, {("c1", 1): False, ("c2", 0): False, ("c2", 1): False})
    done = run_rounds(cfg, runner)
    assert runner.calls == [("vanilla",), ("sessions", 0, ("c0", "c1", "c2")), ("sessions", 1, ("c0", "c1", "c2")),
                            ("fan-in", 2), ("sessions", 2, ("c0", "c1", "c2")), ("sessions", 3, ("c0", "c1", "c2"))]
    # the fan-in gets every chain's state after the round before it
    assert snapshots(runner.fan_ins[2]) == {"c0": "c0.s1", "c1": "c1.s0", "c2": E0}
    # ... and hands each chain all of its peers' latest retained engines and reports, never its own
    for chain, spec in ((c, runner.specs[c, 2]) for c in ("c0", "c1", "c2")):
        peers = {p.chain: p for p in spec.peers}
        assert set(peers) == {"c0", "c1", "c2"} - {chain} and spec.synced_from == tuple(sorted(peers))
        for peer, material in peers.items():
            assert material.engine_dir == Path(f"/syncs/2/{peer}")
            assert report_ids(material.reports) == [(peer, 0), (peer, 1)]
        assert spec.parent_snapshot == runner.fan_ins[2][chain].snapshot    # still its own chain's engine
    assert all(runner.specs[c, s].peers == () for c in ("c0", "c1", "c2") for s in (0, 1, 3))
    assert [o.synced_from for o in done.outcomes if o.session == 2] == [("c1", "c2"), ("c0", "c2"), ("c0", "c1")]
    assert runner.parents()["c2", 3] == "c2.s2"
    assert snapshots(done.states) == {"c0": "c0.s3", "c1": "c1.s3", "c2": "c2.s3"}


def test_a_session_without_an_outcome_stops_the_run_after_its_round():
    cfg = config("sync-chain", chains=2, sessions=3, sync_every=1)
    runner = FakeRunner(cfg, {("c0", 1): "c0/s1: host failure: killed"})
    done = run_rounds(cfg, runner)
    assert runner.ran() == [("c0", 0), ("c1", 0), ("c0", 1), ("c1", 1)]      # no later round, no later fan-in
    assert runner.calls[-1] == ("sessions", 1, ("c0", "c1"))
    assert done.failures == ["c0/s1: host failure: killed"]
    assert [(o.chain, o.session) for o in done.outcomes] == [("c0", 0), ("c1", 0), ("c1", 1)]  # the round's others
    assert snapshots(done.states) == {"c0": "c0.s0", "c1": "c1.s1"}


def _interrupted(cfg: RunConfig, script: dict, finished: set[tuple[str, int]]):
    """A whole run, and what an attempt that finished only `finished` of its sessions had recorded."""
    whole = run_rounds(cfg, FakeRunner(cfg, script))
    return whole, {(o.chain, o.session): o for o in whole.outcomes if (o.chain, o.session) in finished}


@pytest.mark.parametrize("protocol", ["branching", "chain", "sync-chain"])
def test_a_resumed_run_keeps_what_still_follows_and_is_the_run_that_would_have_happened(protocol):
    cfg = config(protocol, chains=2, sessions=3, sync_every=1)
    script = {("c0", 1): False, ("c1", 0): False}
    # c1's s1 was interrupted; c0's s2 and c1's s2 were recorded anyway (chains run at their own pace)
    whole, recorded = _interrupted(cfg, script, {("c0", 0), ("c1", 0), ("c0", 1), ("c0", 2), ("c1", 2)})
    runner = FakeRunner(cfg, script, recorded)
    done = run_rounds(cfg, runner, resumed=True)
    redone = {"branching": [("c1", 1)],                          # branching sessions stand alone
              "chain": [("c1", 1), ("c1", 2)],                   # a chain: after a redone session, its chain's
              "sync-chain": [("c1", 1), ("c0", 2), ("c1", 2)]}   # sync-chain: every chain's (through the fan-ins)
    assert runner.ran() == redone[protocol]
    assert runner.shown == [k for k in recorded if k not in redone[protocol]]
    # sync-chain: a fan-in before each round that has a session to run, with every chain's state at that point
    assert [c for c in runner.calls if c[0] == "fan-in"] == ([("fan-in", 1), ("fan-in", 2)]
                                                             if protocol == "sync-chain" else [])
    assert done.outcomes == whole.outcomes and done.states == whole.states and not done.failures
    assert runner.kept == {k for k in recorded if k not in redone[protocol]}   # told before any session ran


def test_a_sync_round_recorded_whole_needs_no_fan_in_and_a_fresh_run_reads_no_records():
    cfg = config("sync-chain", chains=2, sessions=2, sync_every=1)
    whole, recorded = _interrupted(cfg, {}, {("c0", 0), ("c1", 0), ("c0", 1), ("c1", 1)})
    runner = FakeRunner(cfg, {}, recorded)
    assert run_rounds(cfg, runner, resumed=True).states == whole.states
    assert runner.calls == [("vanilla",)] and len(runner.shown) == 4
    fresh = FakeRunner(cfg, {}, recorded)
    run_rounds(cfg, fresh)                                   # not resumed: the records are not looked at
    assert fresh.ran() == [("c0", 0), ("c1", 0), ("c0", 1), ("c1", 1)] and not fresh.shown


def test_a_recorded_session_from_another_parent_is_redone_and_so_is_its_chains_next():
    cfg = config("chain", chains=1, sessions=2)
    recorded = {("c0", 0): outcome("c0", 0, "another-E0", True), ("c0", 1): outcome("c0", 1, "c0.s0", False)}
    runner = FakeRunner(cfg, {}, recorded)
    done = run_rounds(cfg, runner, resumed=True)
    assert runner.ran() == [("c0", 0), ("c0", 1)] and runner.parents() == {("c0", 0): E0, ("c0", 1): "c0.s0"}
    assert snapshots(done.states) == {"c0": "c0.s1"}
