"""dispatch=workers: a session as a `seis-session` flow run on a work pool (flows/session_flow.py), started with
`run_deployment` and watched until it ends; its answer is read back from the run directory (seis.session.dispatch)
as the same SessionResult the in-process session task returns. A session whose worker stops beating (the worker or
its host gone), or that a worker took but never started, is marked Crashed on the server and dispatched again, up
to REDISPATCHES times. Once the run is being cancelled, no session is dispatched and none is watched any more (its
sessions are cancelled with it: tasks.cancel)."""
from __future__ import annotations

import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from seis.session import RunDir, SessionResult
from seis.session.dispatch import REDISPATCHES, LostTracker, SessionRequest, collect, lost_after_s, start_after_s
from seis.session.resume import clear
from seis.store import SnapshotStore

from . import flow_runs
from .cancelled import RunCancelled, refuse_if_cancelled

POLL_S = 2.0


def _watch(flow_run_id, session_dir: Path, lost_after: float, start_after: float, parent_id=None):
    """The flow run's final state, or (None, why) when its worker is lost; RunCancelled once the run it belongs to
    (parent_id) is being cancelled."""
    from prefect import get_client

    tracker = LostTracker(session_dir, str(flow_run_id), lost_after, start_after)
    with get_client(sync_client=True) as client:
        while True:
            refuse_if_cancelled(parent_id, ask_server=False)  # the parent's own watcher asks the server
            flow_run = client.read_flow_run(flow_run_id)
            state = flow_run.state
            if state is not None and state.is_final():
                return flow_run, None
            why = tracker.lost(state.type.value if state is not None else None)
            if why is not None:
                return flow_run, why
            time.sleep(POLL_S)


def _mark_lost(flow_run_id, message: str) -> None:
    from prefect import get_client
    from prefect.states import Crashed
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)


@task(name="session", task_run_name="{request.chain}/s{request.session} session (worker)", cache_policy=NO_CACHE)
def remote_session_task(request: SessionRequest, deployment: str, store_root) -> SessionResult:
    from prefect.deployments import run_deployment
    from prefect.runtime import flow_run as parent

    lost_after, start_after = lost_after_s(), start_after_s()
    label = f"[{request.chain} s{request.session}]"
    for attempt in range(1 + REDISPATCHES):
        refuse_if_cancelled(parent.id)
        flow_run = run_deployment(name=deployment, parameters={"request": request.model_dump(mode="json")},
                                  timeout=0, as_subflow=True,
                                  tags=[f"chain:{request.chain}", f"session:{request.session}"])
        try:
            flow_run, why = _watch(flow_run.id, request.session_dir, lost_after, start_after, parent.id)
        except RunCancelled:  # perhaps dispatched after the run's children were cancelled: this one ends too
            flow_runs.cancel(flow_run.id, f"its parent flow run {parent.name} was cancelled")
            raise
        if why is None:
            break
        message = f"worker lost: {why}"
        _mark_lost(flow_run.id, message)
        print(f"{label} flow run {flow_run.name}: {message}"
              + ("; dispatching the session again" if attempt < REDISPATCHES else "; giving up"))
        clear(request.session_dir)  # what the lost attempt left: redone from its parent
    state = flow_run.state if why is None else None
    flow_state = (f"flow run {flow_run.name}: {state.name if state else 'lost with its worker'}"
                  f"{': ' + state.message if state and state.message else ''}")
    result = collect(SnapshotStore(store_root), RunDir(Path(request.run_dir)), request.chain, request.session,
                     flow_state=flow_state)
    status = "retained" if result.outcome is not None and result.outcome.retained else "kept parent"
    if result.outcome is not None:
        print(f"{label} (flow run {flow_run.name}) -> {result.outcome.verdict}, {status} ({result.outcome.snapshot})")
    return result
