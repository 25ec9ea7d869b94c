"""What a run lets go of when it ends abnormally: the flow's on_cancellation / on_crashed hooks. They run in the
flow-run process when it can still act (SIGTERM, cancellation seen in-process), or in the worker after it killed
that process; either way they find the run's GPU leases and scratch dir in the registry by flow-run id."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from seis.session.status import read_status, write_status

from .gpu import registry, release_flow_run


def release_run(flow, flow_run, state) -> None:
    logger = logging.getLogger("seis.cleanup")
    try:
        from prefect.logging import get_run_logger
        logger = get_run_logger()
    except Exception:
        try:  # run by the worker after the flow-run process died: no run context, but the run's log all the same
            from prefect.logging.loggers import flow_run_logger
            logger = flow_run_logger(flow_run, flow)
        except Exception:
            pass
    from seis.sandbox import kill_all, sweep_leftovers
    engines = kill_all()  # in the flow-run process: its gates' engines end now (elsewhere there are none)
    orphans = sweep_leftovers()  # after a killed flow-run process: what its sandboxes left behind
    released = release_flow_run(str(flow_run.id), logger)
    ended = _end_task_runs(flow_run, state, logger)
    reg = registry()
    resources = reg.run(str(flow_run.id))
    if resources is not None:
        shutil.rmtree(resources.scratch, ignore_errors=True)
        root = Path(resources.run_dir)
        status = read_status(root)
        kind = "cancelled" if state.is_cancelled() or state.is_cancelling() else "crashed"
        # A run stopped by SIGTERM marks itself crashed before this hook runs; a cancellation is told only here.
        if status is not None and (status.state == "running" or (status.state == "crashed" and kind == "cancelled")):
            write_status(root, kind, message=f"the flow run {flow_run.name} was {kind}: {state.message or ''}"
                         .strip())
        reg.drop_run(str(flow_run.id))
    logger.info("run cleanup after %s: %d GPU slot lease(s) released, %d unfinished task run(s) ended, %d "
                "sandbox(es) and %d orphaned sandbox process(es) killed, scratch removed", state.type.value.lower(),
                released, ended, engines, orphans)


def _end_task_runs(flow_run, state, logger) -> int:
    """A killed flow run cannot end its own task runs, and the UI would show them Running for ever: give each
    unfinished one the run's end (Crashed or Cancelled)."""
    try:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterState,
                                                    TaskRunFilterStateType)
        from prefect.client.schemas.objects import StateType
        from prefect.states import Cancelled, Crashed

        end = Cancelled if state.is_cancelled() or state.is_cancelling() else Crashed
        unfinished = TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(
            any_=[StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED])))
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
                                         task_run_filter=unfinished)
            for run in runs:
                client.set_task_run_state(run.id, end(message=f"its flow run {flow_run.name} ended"), force=True)
        return len(runs)
    except Exception as e:  # cleanup goes on: leases and scratch matter more than the UI
        logger.warning("could not end the flow run's unfinished task runs: %s", e)
        return 0
