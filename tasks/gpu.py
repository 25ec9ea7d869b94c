"""The GPU concurrency limit: build and gate steps never overlap on one GPU."""
from __future__ import annotations

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
