"""What SEIS asks the Prefect server about flow runs, and the states it gives them when a run ends abnormally:
its own state (cancelled? gone?), its unfinished task runs, its child session flow runs (dispatch=workers), the
tag that links a resumed attempt to the one it continues. Every call opens its own sync client: these run from
hooks, watcher threads and other flows' processes alike."""
from __future__ import annotations

import logging
from uuid import UUID

UNFINISHED = ("RUNNING", "PENDING", "SCHEDULED", "PAUSED")


def _client():
    from prefect import get_client
    return get_client(sync_client=True)


def _uuid(flow_run_id) -> UUID:
    return flow_run_id if isinstance(flow_run_id, UUID) else UUID(str(flow_run_id))


def read(flow_run_id):
    """The flow run (name, state, parameters, tags), or None when the server does not know it."""
    from prefect.exceptions import ObjectNotFound
    with _client() as client:
        try:
            return client.read_flow_run(_uuid(flow_run_id))
        except ObjectNotFound:
            return None


def stopping(flow_run) -> bool:
    """Whether a flow run is being cancelled or has ended: nothing more may be started for it."""
    state = flow_run.state if flow_run is not None else None
    return state is not None and (state.is_cancelling() or state.is_final())


def cancel_children(flow_run_id, message: str) -> list[str]:
    """Ask for every unfinished child flow run of this one (its sessions on workers) to be cancelled, as `prefect
    flow-run cancel` does: a running one goes Cancelling and its worker kills it, one no worker has taken yet is
    Cancelled at once. Returns the children's names."""
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterParentFlowRunId, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    unfinished = FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType(s) for s in UNFINISHED]))
    with _client() as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[_uuid(flow_run_id)]), state=unfinished))
        for child in children:
            client.set_flow_run_state(child.id, Cancelling(message=message))
    return [child.name for child in children]


def cancel(flow_run_id, message: str) -> None:
    from prefect.states import Cancelling
    with _client() as client:
        client.set_flow_run_state(_uuid(flow_run_id), Cancelling(message=message))


def end_task_runs(flow_run_id, cancelled: bool, message: str) -> int:
    """A flow run that ended abnormally cannot end its own task runs, and the UI would show them Running for ever:
    give each unfinished one the run's end (Cancelled or Crashed). Returns how many."""
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterState,
                                                TaskRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Crashed

    end = Cancelled if cancelled else Crashed
    unfinished = TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(
        any_=[StateType(s) for s in UNFINISHED])))
    with _client() as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[_uuid(flow_run_id)])),
                                     task_run_filter=unfinished)
        for run in runs:
            client.set_task_run_state(run.id, end(message=message), force=True)
    return len(runs)


def crash(flow_run_id, message: str) -> None:
    from prefect.states import Crashed
    with _client() as client:
        client.set_flow_run_state(_uuid(flow_run_id), Crashed(message=message), force=True)


def add_tags(flow_run_id, *tags: str) -> None:
    with _client() as client:
        run = client.read_flow_run(_uuid(flow_run_id))
        client.update_flow_run(run.id, tags=[*run.tags, *(t for t in tags if t not in run.tags)])


def run_logger(fallback: str) -> logging.Logger:
    """The current flow or task run's logger (its lines reach the UI), else the named logger."""
    try:
        from prefect import get_run_logger
        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a run context
        return logging.getLogger(fallback)
