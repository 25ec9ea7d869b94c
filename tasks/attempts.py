"""The flow runs that worked in one run directory, and what a resumed one does about the attempt it continues.

A `seis evolve` killed outright (SIGKILL, a lost machine) cannot end its own flow run: against a shared server
the UI would show it Running for ever, its task runs too, and its sessions on workers would run on. The run
directory records every attempt's flow run (`flow_runs.json`), so a resumed run, which holds the run's lock and
hence knows that no earlier attempt still works there, marks each earlier one the server still shows unfinished
Crashed, ends its task runs and cancels its sessions; it is tagged `resumes:<flow-run-id>` with the attempt it
continues, and the record says so too."""
from __future__ import annotations

import logging
import time

from seis.session.rundir import RunDir

from . import flow_runs
from .gpu import api_key

RESUMES_TAG = "resumes:{}"


def begin_attempt(run: RunDir, flow_run_id: str, resumed: bool, logger: logging.Logger | None = None) -> str | None:
    """Record this flow run in the run directory; on resume, end the earlier attempts as above. Returns the id of
    the flow run this one continues (the latest earlier attempt on this server), if any."""
    logger = logger or flow_runs.run_logger("seis.attempts")
    earlier = [a for a in run.attempts() if a["flow_run_id"] != str(flow_run_id) and a.get("api") == api_key()]
    continued = earlier[-1]["flow_run_id"] if resumed and earlier else None
    run.record_attempt({"flow_run_id": str(flow_run_id), "name": _name(flow_run_id), "api": api_key(),
                        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumes": continued})
    if not resumed:
        return None
    for attempt in earlier:
        _end_unfinished(attempt, flow_run_id, logger)
    if continued is not None:
        try:
            flow_runs.add_tags(flow_run_id, RESUMES_TAG.format(continued))
        except Exception as e:  # noqa: BLE001 - flow_runs.json still links them
            logger.warning("could not tag this flow run with the one it resumes: %s", e)
        logger.info("resuming flow run %s (%s)", earlier[-1].get("name") or continued, continued)
    return continued


def _end_unfinished(attempt: dict, flow_run_id: str, logger: logging.Logger) -> None:
    """An earlier attempt the server still shows unfinished: its process is gone, so it crashed."""
    old_id, name = attempt["flow_run_id"], attempt.get("name") or attempt["flow_run_id"]
    try:
        old = flow_runs.read(old_id)
        if old is None or old.state is None or old.state.is_final():
            return
        message = f"its process is gone; the run was resumed by flow run {_name(flow_run_id)} ({flow_run_id})"
        flow_runs.crash(old_id, message)
        ended = flow_runs.end_task_runs(old_id, cancelled=False, message=message)
        sessions = flow_runs.cancel_children(old_id, message)
    except Exception as e:  # noqa: BLE001 - the resumed run goes on; only the UI keeps the old one Running
        logger.warning("could not mark the earlier flow run %s (%s) crashed: %s", name, old_id, e)
        return
    logger.warning("the earlier flow run %s (%s) was still %s: marked Crashed, %d task run(s) ended, sessions "
                   "cancelled: %s", name, old_id, old.state.name, ended, ", ".join(sessions) or "none")


def _name(flow_run_id) -> str:
    from prefect.runtime import flow_run
    return flow_run.name if str(flow_run.id) == str(flow_run_id) else str(flow_run_id)
