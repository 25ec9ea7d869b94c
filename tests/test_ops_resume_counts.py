"""What a resumed run says is done: status.json's sessions_done, the best so far and the next resume's choice count
only the sessions whose recorded outcome stands, never the stale ones that the resume redoes. The protocol loop
(seis.session.rounds) runs with a runner that records outcomes in a real run directory, as the flow's does; no
Prefect, no gates."""
from __future__ import annotations

import pytest

from seis.run_config import RunConfig
from seis.session import RunDir, SessionOutcome, SessionResult, run_rounds, session_spec
from seis.session.lineage import fan_in
from seis.session.resume import clear, finished, keep_only, recorded_outcomes, save_outcome
from seis.session.status import read_status, write_status
from seis.workspace import Report

E0 = "E0"
ATTEMPT = "fr-1"


class Store(set):
    """Every snapshot id is held: only the outcome files decide what is finished."""
    def __contains__(self, item) -> bool:
        return True


def outcome(chain: str, session: int, parent: str, kept: bool, speedup: float) -> SessionOutcome:
    return SessionOutcome(
        chain=chain, session=session, parent_snapshot=parent, snapshot=f"{chain}.s{session}" if kept else parent,
        retained=kept, verdict="pass" if kept else "fail", reasons=(), dev_speedup_vs_vanilla=speedup,
        dev_speedup_vs_parent=speedup, synced_from=(), agent="fake", applied=(), adopted=(), tokens_in=0,
        tokens_out=0, cost_usd=0.0, wall_s=0.0, report=Report(chain, session, f"{chain} s{session}", "retained" if kept else "rejected"))


class DiskRunner:
    """Sessions recorded as the flow records them (report.md, then outcome.json and its count); `kept`: whether a
    session retains its engine (default yes); `interrupt_after`: the session after whose record the attempt is
    interrupted. Notes status.json's sessions_done as each round starts."""

    def __init__(self, config: RunConfig, run: RunDir, kept=None, interrupt_after=None, speedup=1.0):
        self.config, self.run, self.kept = config, run, kept or {}
        self.interrupt_after, self.speedup = interrupt_after, speedup
        self.done_at_start: list[int] = []
        self.ran: list[tuple[str, int]] = []

    def pin_vanilla(self):
        return E0

    def recorded(self, chain, session):
        return finished(self.run.session_dir(chain, session), Store())

    def keep_only(self, kept):
        keep_only(self.run.root, kept)

    def fan_in(self, states, session):
        return fan_in(states, {c: self.run.root / "syncs" / c for c in states})

    def run_sessions(self, session, chains, vanilla, states, peers):
        self.done_at_start.append(read_status(self.run.root).sessions_done)
        results = {}
        for chain in chains:
            clear(self.run.session_dir(chain, session))   # as the flow does: what an earlier attempt left
            spec = session_spec(self.config, self.run, vanilla, states, peers, session, chain)
            done = record(self.run, outcome(chain, session, spec.parent_snapshot,
                                            self.kept.get((chain, session), True), self.speedup))
            self.ran.append((chain, session))
            results[chain] = SessionResult(chain, session, outcome=done)
            if (chain, session) == self.interrupt_after:
                raise KeyboardInterrupt
        return results

    def show_recorded(self, outcome):
        pass


def record(run: RunDir, done: SessionOutcome) -> SessionOutcome:
    session_dir = run.session_dir(done.chain, done.session)
    session_dir.mkdir(parents=True, exist_ok=True)
    (session_dir / "report.md").write_text("report\n")
    save_outcome(session_dir, done)
    return done


def started(tmp_path, protocol="chain", chains=1, sessions=3) -> tuple[RunConfig, RunDir]:
    config = RunConfig(protocol=protocol, chains=chains, sessions=sessions, out=tmp_path / "run")
    run = RunDir.create(config.out, config.model_dump_json())
    write_status(run.root, "running", flow_run_id=ATTEMPT, sessions_total=chains * sessions)
    return config, run


def test_a_resume_counts_only_the_outcomes_that_stand_before_it_redoes_anything(tmp_path):
    config, run = started(tmp_path)
    # an earlier attempt recorded c0/s0 and c0/s2 but not c0/s1: c0/s2 followed a c0/s1 that the resume redoes
    record(run, outcome("c0", 0, E0, True, 1.1))
    record(run, outcome("c0", 2, "c0.s1", True, 9.9))   # stale: the fastest, but from a session that is redone
    assert read_status(run.root).sessions_done == 2
    runner = DiskRunner(config, run, speedup=1.2)
    run_rounds(config, runner, resumed=True)
    assert runner.ran == [("c0", 1), ("c0", 2)]
    # at the redo of c0/s1 only c0/s0 stands; c0/s2 is no longer counted (nor picked as the best so far)
    assert runner.done_at_start == [1, 2]
    assert read_status(run.root).sessions_done == 3
    assert max(o.dev_speedup_vs_vanilla for o in recorded_outcomes(run.root)) == 1.2


def test_a_stale_outcome_is_not_kept_by_a_second_resume_of_a_resume_interrupted_before_its_round(tmp_path):
    config, run = started(tmp_path)
    record(run, outcome("c0", 0, E0, True, 1.1))
    record(run, outcome("c0", 2, "c0.s0", True, 1.3))  # stale: followed the c0/s1 that was not recorded
    # the first resume redoes c0/s1 (rejected again: the chain's parent stays c0.s0) and is interrupted
    with pytest.raises(KeyboardInterrupt):
        run_rounds(config, DiskRunner(config, run, kept={("c0", 1): False}, interrupt_after=("c0", 1)), resumed=True)
    assert read_status(run.root).sessions_done == 2
    stale = run.session_dir("c0", 2)
    assert (stale / "outcome.stale.json").is_file() and not (stale / "outcome.json").exists()  # set aside, kept
    # the second resume must redo c0/s2: it started from the old c0/s1's report, not the one now recorded
    second = DiskRunner(config, run, kept={("c0", 1): False})
    done = run_rounds(config, second, resumed=True)
    assert second.ran == [("c0", 2)]
    assert [o.dev_speedup_vs_vanilla for o in done.outcomes] == [1.1, 1.0, 1.0]


def test_an_unreadable_status_or_attempt_record_is_kept_beside_the_new_one(tmp_path):
    """A status.json or flow_runs.json that cannot be read (a hand edit, a disk fault) is not overwritten by the
    next write: it is kept as <name>.unreadable-<time>, and the new status says so."""
    run = RunDir.create(tmp_path / "run", "{}")
    (run.root / "status.json").write_text('{"state": "running", "resumes": 3, ')   # cut short
    (run.root / "flow_runs.json").write_text('[{"flow_run_id": "fr-0"')
    status = write_status(run.root, "running", flow_run_id=ATTEMPT, restart=True, message="")
    run.record_attempt({"flow_run_id": ATTEMPT})
    kept = {p.name.split(".unreadable-")[0]: p.read_text() for p in run.root.glob("*.unreadable-*")}
    assert kept == {"status.json": '{"state": "running", "resumes": 3, ', "flow_runs.json": '[{"flow_run_id": "fr-0"'}
    assert "could not be read" in status.message and read_status(run.root) == status
    assert [a["flow_run_id"] for a in run.attempts()] == [ATTEMPT]
    # readable records are appended to and rewritten in place, nothing set aside
    run.record_attempt({"flow_run_id": "fr-2"})
    write_status(run.root, "complete", flow_run_id=ATTEMPT)
    assert len(list(run.root.glob("*.unreadable-*"))) == 2 and len(run.attempts()) == 2
