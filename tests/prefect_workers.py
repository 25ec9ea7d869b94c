"""Prefect's log and event workers of this process, drained while the server they send to still runs.

Each worker sends to the API URL it was made for. One left with items for a server a test has stopped retries each
item at interpreter exit, where Prefect drains every worker without a bound: the test process then hung for
tens of minutes after its last test (seen with the scale-out module's server and the harness's in one process)."""
from __future__ import annotations


def drain_api_workers(timeout_s: float = 30.0) -> None:
    """Send what the log and event workers hold, at most timeout_s each, and stop them (the next use makes new
    ones). Call it before stopping the server they send to."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)
