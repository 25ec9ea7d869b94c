"""How a run's status.json ends when something fails outside its sessions: every failure after the run says it is
running leaves it failed (or crashed, when interrupted), never running. The flow's `_run` is called directly with
its setup failing; no Prefect server, no sessions."""
from __future__ import annotations

import pytest

import flows.seis_flow as seis_flow
from seis.run_config import RunConfig
from seis.session import RunDir

ATTEMPT = "fr-end-1"


class BrokenRegistry:
    """A registry whose home cannot be written (an unwritable PREFECT_HOME)."""
    def __init__(self, error: BaseException):
        self.error = error

    def add_run(self, *args):
        raise self.error

    def drop_run(self, flow_run_id):
        pass


@pytest.mark.parametrize("error, state", [(PermissionError(13, "Permission denied"), "failed"),
                                          (KeyboardInterrupt(), "crashed")])
def test_a_run_whose_setup_fails_after_it_said_running_does_not_stay_running(tmp_path, monkeypatch, error, state):
    config = RunConfig(protocol="chain", chains=1, sessions=1, out=tmp_path / "run")
    run = RunDir.create(config.out, config.model_dump_json())
    monkeypatch.setattr(seis_flow, "registry", lambda: BrokenRegistry(error))
    with pytest.raises(type(error)):
        seis_flow._run(config, run, resumed=False, flow_run_id=ATTEMPT)
    status = run.status()
    assert status.state == state, status
    assert type(error).__name__ in status.message and "--resume" in status.note   # says why, and how to go on


def test_what_post_validation_flags_about_the_best_engine_is_said_where_the_run_ends(tmp_path, monkeypatch):
    from seis.session import SessionOutcome
    from seis.session.resume import save_outcome
    from seis.workspace import Report

    config = RunConfig(protocol="chain", chains=1, sessions=1, out=tmp_path / "run", post_validate="quick")
    run = RunDir.create(config.out, config.model_dump_json())
    best = SessionOutcome(chain="c0", session=0, parent_snapshot="E0", snapshot="c0s0", retained=True,
                          verdict="pass", reasons=(), dev_speedup_vs_vanilla=1.5, dev_speedup_vs_parent=1.5,
                          synced_from=(), agent="fake", applied=(), adopted=(), tokens_in=0, tokens_out=0,
                          cost_usd=0.0, wall_s=1.0, report=Report("c0", 0, "notes", "retained"))
    run.session_dir("c0", 0).mkdir(parents=True)
    save_outcome(run.session_dir("c0", 0), best)
    flag = "gsm8k: candidate 40.0% vs vanilla 60.0% (beyond 5 points)"
    artifacts = []
    monkeypatch.setattr(seis_flow, "post_validate_task", lambda *a: {"snapshot": "c0s0", "flags": [flag]})
    monkeypatch.setattr(seis_flow, "create_markdown_artifact", lambda text, **kw: artifacts.append(text))
    monkeypatch.setattr(seis_flow, "create_table_artifact", lambda *a, **kw: None)
    root, flagged = seis_flow._finish(config, run, "E0", [best])
    assert root == str(run.root)
    assert "c0s0" in flagged and flag in flagged and "postval" in flagged   # the engine, the flag, where to look
    assert flag in artifacts[0]                                              # the summary artifact says it too
