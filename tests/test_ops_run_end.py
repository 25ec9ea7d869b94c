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
