"""dispatch=workers: a session as a `seis-session` flow run on a work pool (flows/session_flow.py), started with
`run_deployment` and waited for; its answer is read back from the run directory (seis.session.dispatch) as the
same SessionResult the in-process session task returns."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from seis.session import RunDir, SessionResult
from seis.session.dispatch import SessionRequest, collect
from seis.store import SnapshotStore

POLL_S = 2.0


@task(name="session", task_run_name="{request.chain}/s{request.session} session (worker)", cache_policy=NO_CACHE)
def remote_session_task(request: SessionRequest, deployment: str, store_root) -> SessionResult:
    from prefect.deployments import run_deployment

    flow_run = run_deployment(name=deployment, parameters={"request": request.model_dump(mode="json")},
                              timeout=None, poll_interval=POLL_S, as_subflow=True,
                              tags=[f"chain:{request.chain}", f"session:{request.session}"])
    state = flow_run.state
    result = collect(SnapshotStore(store_root), RunDir(Path(request.run_dir)), request.chain,
                     request.session, flow_state=f"flow run {flow_run.name}: {state.name if state else '?'}"
                                                 f"{': ' + state.message if state and state.message else ''}")
    status = "retained" if result.outcome is not None and result.outcome.retained else "kept parent"
    if result.outcome is not None:
        print(f"[{request.chain} s{request.session}] (flow run {flow_run.name}) -> {result.outcome.verdict}, "
              f"{status} ({result.outcome.snapshot})")
    return result
