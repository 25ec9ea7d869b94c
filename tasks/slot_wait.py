"""Waiting for a GPU slot: who holds it (the holder's step and its run, so that a wait behind another run says
which), and the acquisition itself, which a cancelled run never completes.

Prefect's own acquisition waits as long as the server's Retry-After says (up to 30 s) and cannot be stopped
midway, so a gate of a run cancelled meanwhile would still take the slot. Here every attempt is one request, and
between attempts the run's cancellation is looked at every CHECK_S seconds; a slot granted just as the run was
cancelled is given back at once."""
from __future__ import annotations

import time
from uuid import UUID

from .cancelled import RunCancelled, refuse_if_cancelled

CHECK_S = 1.0           # how often a waiting gate looks whether its run is being cancelled
MIN_PAUSE_S, MAX_PAUSE_S = 0.5, 30.0   # between two attempts, whatever the server says (it may say 0)


def describe_holder(lease, run_dir: str | None = None) -> str:
    """'c0/s1 build-and-gate of flow run brave-fox (1a2b3c4d…), run runs/20250101-0100, pid 42': the holder's
    step and the run it belongs to (its flow run's name, and the run directory where it is known)."""
    from . import flow_runs
    name, where = lease.flow_run_id, run_dir
    try:
        flow_run = flow_runs.read(lease.flow_run_id)
    except Exception:  # noqa: BLE001 - the line is still worth logging without the name
        flow_run = None
    if flow_run is not None:
        name = f"{flow_run.name} ({lease.flow_run_id[:8]}…)"
        request = flow_run.parameters.get("request")  # a session on a worker names its run's directory
        where = where or (request.get("run_dir") if isinstance(request, dict) else None)
    return f"{lease.label} of flow run {name}" + (f", run {where}" if where else "") + f", pid {lease.pid}"


def waiting_line(limit: str, holders: list[str]) -> str:
    return f"waiting for the GPU slot ({limit})" + (f"; held by {'; '.join(holders)}" if holders else "")


def acquire(limit: str, lease_s: float, flow_run_id, holder=None) -> UUID:
    """A lease on one slot of `limit` for the flow run `flow_run_id`; raises RunCancelled, holding nothing, once
    the run is being cancelled (or this process interrupted), before or while it waits."""
    from prefect import get_client
    from prefect.client.schemas.responses import ConcurrencyLimitWithLeaseResponse

    with get_client(sync_client=True) as client:
        while True:
            refuse_if_cancelled(flow_run_id)
            response, retry_after = _attempt(client, limit, lease_s, holder)
            if response is None:
                _pause(retry_after, flow_run_id)
                continue
            granted = ConcurrencyLimitWithLeaseResponse.model_validate(response.json())
            if not granted.limits:
                raise RuntimeError(f"the concurrency limit {limit} does not exist")
            try:
                refuse_if_cancelled(flow_run_id)
            except RunCancelled:  # cancelled while the slot was being granted: give it back at once
                client.release_concurrency_slots_with_lease(granted.lease_id)
                raise
            return granted.lease_id


def _attempt(client, limit: str, lease_s: float, holder):
    """(the server's grant, None), or (None, seconds to wait) when the slot is taken."""
    import httpx
    try:
        return client.increment_concurrency_slots_with_lease(names=[limit], slots=1, mode="concurrency",
                                                             lease_duration=lease_s, holder=holder), 0.0
    except httpx.HTTPStatusError as e:
        if e.response.status_code != 423:
            raise
        return None, float(e.response.headers.get("Retry-After", CHECK_S))


def _pause(seconds: float, flow_run_id) -> None:
    """Wait before the next attempt, looking at the run's cancellation every CHECK_S seconds."""
    deadline = time.monotonic() + min(max(seconds, MIN_PAUSE_S), MAX_PAUSE_S)
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(CHECK_S, left))
        refuse_if_cancelled(flow_run_id)
