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
    released = release_flow_run(str(flow_run.id), logger)
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
    logger.info("run cleanup after %s: %d GPU slot lease(s) released, scratch removed", state.type.value.lower(),
                released)
