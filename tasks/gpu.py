"""The GPU concurrency limit: build and gate steps never overlap on one GPU.

The slot is held through a short lease (the server's minimum, renewed while held) and every lease is written in a
registry beside Prefect's home (seis.session.resources), so that it is released at once when its holder is
cancelled or crashes (the flow's hooks) or was killed outright (the next run releases leases of dead processes),
instead of blocking every later gate until the lease expires."""
from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

from seis.session.resources import Registry

GPU_LIMIT = "seis-gpu"
LEASE_S = 60.0          # the server's minimum; renewed every ~45 s while held


def device_limit(device_slot: str = "") -> str:
    """The limit a session's build and gate hold: the run's one `seis-gpu`, or, for a session on a worker that owns
    a device (dispatch=workers), one limit per device of its host, `seis-gpu-<host>-<device>`: the workers of one
    host never share a device, those of two hosts never wait for each other."""
    if not device_slot:
        return GPU_LIMIT
    import re
    import socket
    host = re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname()).strip("-") or "host"
    return f"{GPU_LIMIT}-{host}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', device_slot)}"


def registry() -> Registry:
    from prefect.settings import PREFECT_HOME
    return Registry(Path(PREFECT_HOME.value()) / "seis")


OWN_SERVER_ENV = "SEIS_OWN_PREFECT_SERVER"  # set by `seis evolve` to the URL of the server it started for the run


def api_key() -> str:
    """Which server a lease belongs to. An ephemeral server, and the server a run starts for itself, are their
    database's home: the run's own server gets a new port at every start (a resume), the same database."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME
    url = PREFECT_API_URL.value()
    if not url:
        return f"ephemeral:{PREFECT_HOME.value()}"
    if os.environ.get(OWN_SERVER_ENV) == url:
        return f"own:{PREFECT_HOME.value()}"
    return url


def ensure_gpu_limit(slots: int = 1, name: str = GPU_LIMIT) -> None:
    """Create the global concurrency limit if it is missing (an existing one is left as its owner set it), and
    release the leases of holders that no longer exist.

    Acquisition is strict, so the limit is never silently skipped."""
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    release_stale()
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))
            except Exception:  # created meanwhile by another worker or run
                client.read_global_concurrency_limit_by_name(name)
            return
        if limit.active_slots and api_key().startswith(("ephemeral:", "own:")) and \
                not any(lease.alive for lease in registry().leases(api_key())):
            # This run's own database, its earlier server gone with its in-memory leases (or killed between the
            # grant and the registry's record of it): nobody holds a slot.
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))


def release(leases, logger=None) -> int:
    """Release these leases on the server and forget them; returns how many were released."""
    from prefect import get_client

    logger = logger or logging.getLogger("seis.gpu")
    reg, done = registry(), 0
    with get_client(sync_client=True) as client:
        for lease in leases:
            try:
                client.release_concurrency_slots_with_lease(lease.lease_id)
                done += 1
                logger.info("released the GPU slot held by %s (flow run %s, pid %d)", lease.label,
                            lease.flow_run_id, lease.pid)
            except Exception as e:  # already expired or released: nothing is held any more
                logger.info("GPU slot lease %s of %s is already gone (%s)", lease.lease_id, lease.label,
                            type(e).__name__)
            reg.drop_lease(lease.lease_id)
    return done


def release_stale(logger=None) -> int:
    return release(registry().stale_leases(api_key()), logger)


def release_flow_run(flow_run_id: str, logger=None) -> int:
    return release(registry().leases_of(str(flow_run_id), api_key()), logger)


@contextmanager
def gpu_slot(label: str = "gpu step", limit: str = GPU_LIMIT):
    """Hold the GPU slot for a build or gate, logging the wait (and who holds the slot meanwhile: their step and
    run) so that time queued shows as waiting, not work. A run that is being cancelled never gets the slot
    (tasks.cancelled.RunCancelled)."""
    from prefect import get_run_logger
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.runtime import flow_run, task_run

    from .prefect_private import maintain_concurrency_lease, release_concurrency_slots_with_lease
    from .slot_wait import acquire, describe_holder, waiting_line

    logger = get_run_logger()
    reg = registry()
    holders = [describe_holder(lease, _run_dir_of(reg, lease.flow_run_id)) for lease in reg.leases(api_key())]
    logger.info(waiting_line(limit, holders))
    t0 = time.monotonic()
    holder = ConcurrencyLeaseHolder(type="task_run", id=task_run.id) if task_run.id else None
    lease = acquire(limit, LEASE_S, flow_run.id, holder)
    lease_id = str(lease)
    reg.add_lease(lease_id, str(flow_run.id), label, api_key())
    logger.info("GPU slot acquired after waiting %.1f s", time.monotonic() - t0)
    held = time.monotonic()
    try:
        with maintain_concurrency_lease(lease, LEASE_S, raise_on_lease_renewal_failure=False):
            yield
    finally:
        if lease_id not in {recorded.lease_id for recorded in reg.leases()}:
            logger.info("GPU slot released (by the run's cancellation) after %.1f s", time.monotonic() - held)
        else:
            try:
                release_concurrency_slots_with_lease(lease)
                reg.drop_lease(lease_id)
                logger.info("GPU slot released after %.1f s", time.monotonic() - held)
            except Exception as e:  # kept in the registry: the flow's hooks or the next run release it
                logger.warning("the GPU slot could not be released now (%s); it is released by the run's cleanup",
                               type(e).__name__)


def _run_dir_of(reg: Registry, flow_run_id: str) -> str | None:
    resources = reg.run(flow_run_id)
    return resources.run_dir if resources is not None else None
