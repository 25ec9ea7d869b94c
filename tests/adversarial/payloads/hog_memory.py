"""Attack: take the memory the other engines need, so that the reference fails and the gate, with no verdict,
ends the run. At import, before the gate builds anything: on CUDA, every byte of device memory the driver reports
free but a sliver, held for the engine's life; on either device, HOST_BYTES of its RAM-backed /tmp, which no
per-process limit counts.

Safety limit: HOST_BYTES is 3 GiB, twice the sandbox bound its test sets (1.5 GiB), so the host never runs short
should a gate leave the sandbox unbounded (a host without memory cgroups)."""
from __future__ import annotations

import os

HOST_BYTES = 3 * 2**30
CHUNK = 2**26
COUNTS = {"host_bytes": 0, "device_bytes": 0}
_HELD: list = []


def _take_device_memory() -> None:
    import torch
    if not torch.cuda.is_available():
        return
    free, _ = torch.cuda.mem_get_info()
    take = free - 256 * 2**20
    if take > 0:
        _HELD.append(torch.empty(take, dtype=torch.uint8, device="cuda"))
        COUNTS["device_bytes"] = take


def _take_host_memory() -> None:
    with open(f"/tmp/seis-adv-hog-{os.getpid()}", "wb") as f:
        block = b"\1" * CHUNK
        while COUNTS["host_bytes"] < HOST_BYTES:
            f.write(block)
            COUNTS["host_bytes"] += CHUNK


_take_device_memory()
_take_host_memory()

from .engine import Engine  # noqa: E402

_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), **{f"adv_{k}": v for k, v in COUNTS.items()}}
