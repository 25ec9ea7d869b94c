"""What a run lets go of when it ends abnormally: the flow's on_cancellation / on_crashed hooks. They run in the
flow-run process when it can still act (SIGTERM, cancellation seen in-process), or in the worker after it killed
that process; either way they find the run's GPU leases and scratch dir in the registry by flow-run id, and its
child session flow runs (dispatch=workers) on the server."""
from __future__ import annotations

import logging
from pathlib import Path

from seis.session.resources import remove_scratch
from seis.session.status import read_status, write_status

from .flow_runs import cancel_children, end_task_runs
from .gpu import registry, release_flow_run


def release_run(flow, flow_run, state) -> None:
    logger = _logger(flow, flow_run)
    from seis.sandbox import kill_all, sweep_leftovers
    from seis.sandbox.scope import close_all
    engines = kill_all()  # in the flow-run process: its gates' engines end now (elsewhere there are none)
    close_all()           # and its dev benchmarks' process groups
    orphans = sweep_leftovers()  # after a killed flow-run process: what its sandboxes left behind
    released = release_flow_run(str(flow_run.id), logger)
    cancelled = state.is_cancelled() or state.is_cancelling()
    kind = "cancelled" if cancelled else "crashed"
    ended = _end_task_runs(flow_run, cancelled, logger)
    children = _cancel_children(flow_run, kind, logger)
    reg = registry()
    resources = reg.run(str(flow_run.id))
    if resources is not None:
        remove_scratch(Path(resources.scratch))  # engines' caches: hostile input, however deep
        root = Path(resources.run_dir)
        # A run stopped by SIGTERM marks itself crashed before this hook runs; a cancellation is told only here.
        # A run that had ended otherwise keeps its status (write_status leaves an ended run's status as it is), and
        # so does a run a resume already started again (this hook can come late: its write names its flow run).
        if read_status(root) is not None:
            write_status(root, kind, flow_run_id=str(flow_run.id),
                         message=f"the flow run {flow_run.name} was {kind}: {state.message or ''}".strip())
        reg.drop_run(str(flow_run.id))
    logger.info("run cleanup after %s: %d GPU slot lease(s) released, %d unfinished task run(s) ended, %d child "
                "flow run(s) cancelled, %d sandbox(es) and %d orphaned sandbox process(es) killed, scratch removed",
                state.type.value.lower(), released, ended, children, engines, orphans)


def _logger(flow, flow_run):
    try:
        from prefect.logging import get_run_logger
        return get_run_logger()
    except Exception:
        try:  # run by the worker after the flow-run process died: no run context, but the run's log all the same
            from prefect.logging.loggers import flow_run_logger
            return flow_run_logger(flow_run, flow)
        except Exception:
            return logging.getLogger("seis.cleanup")


def _end_task_runs(flow_run, cancelled: bool, logger) -> int:
    try:
        return end_task_runs(flow_run.id, cancelled, f"its flow run {flow_run.name} ended")
    except Exception as e:  # cleanup goes on: leases and scratch matter more than the UI
        logger.warning("could not end the flow run's unfinished task runs: %s", e)
        return 0


def _cancel_children(flow_run, kind: str, logger) -> int:
    """The run's sessions on workers (dispatch=workers) end with it: no one would use what they produce, and they
    hold their workers' GPU slots."""
    try:
        return len(cancel_children(flow_run.id, f"its parent flow run {flow_run.name} was {kind}"))
    except Exception as e:  # noqa: BLE001
        logger.warning("could not cancel the flow run's child flow runs: %s", e)
        return 0
