"""The GPU concurrency limit: build and gate steps never overlap on one GPU."""
from __future__ import annotations

import time
from contextlib import contextmanager

GPU_LIMIT = "seis-gpu"


def ensure_gpu_limit(slots: int = 1) -> None:
    """Create the global concurrency limit if it is missing (an existing one is left as its owner set it).

    `concurrency(..., strict=True)` then refuses to run without it, so the limit is never silently skipped."""
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(GPU_LIMIT)
        except ObjectNotFound:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=GPU_LIMIT, limit=slots))


@contextmanager
def gpu_slot():
    """Hold the GPU slot for a build or gate, logging the wait so that time queued shows as waiting, not work."""
    from prefect import get_run_logger
    from prefect.concurrency.sync import concurrency

    logger = get_run_logger()
    logger.info("waiting for the GPU slot (%s)", GPU_LIMIT)
    t0 = time.monotonic()
    with concurrency(GPU_LIMIT, occupy=1, strict=True):
        logger.info("GPU slot acquired after waiting %.1f s", time.monotonic() - t0)
        held = time.monotonic()
        yield
    logger.info("GPU slot released after %.1f s", time.monotonic() - held)
