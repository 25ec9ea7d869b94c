"""Run timed engine processes on one shared CPU.

Each engine's host loop (scheduling, metadata, one synchronisation per decode step) runs on whichever CPU the
kernel placed its process. On a virtual machine the CPUs differ from moment to moment (steal time, clocks), and
a process tends to stay where it was placed, so identical engines measured 5-7 % apart. Timed requests run one
at a time, so all engines can share one CPU: they then see the same CPU, and the interleaved order spreads its
drift over all of them.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


@contextmanager
def pinned_together(pids: Iterable[int]) -> Iterator[int | None]:
    """Pin every thread of `pids` to one CPU (the last this process may use) for the block; yields the CPU, or
    None where affinity cannot be set (another OS, a denied call). Previous masks are restored afterwards."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    cpu = max(os.sched_getaffinity(0))
    saved: dict[int, set[int]] = {}
    try:
        for pid in pids:
            for tid in _threads(pid):
                if tid not in saved:
                    saved[tid] = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, {cpu})
    except OSError:  # a thread that ended meanwhile, or no permission: measure unpinned
        _restore(saved)
        yield None
        return
    try:
        yield cpu
    finally:
        _restore(saved)


def _restore(saved: dict[int, set[int]]) -> None:
    for tid, mask in saved.items():
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            pass  # the thread or process is gone
