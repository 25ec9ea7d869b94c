"""Run timed engine processes on one shared CPU.

Each engine's host loop (scheduling, metadata, one synchronisation per decode step) runs on whichever CPU the
kernel placed its process. On a virtual machine the CPUs differ from moment to moment (steal time, clocks), and
a process tends to stay where it was placed, so identical engines measured 5-7 % apart. Timed requests run one
at a time, so all engines can share one CPU: they then see the same CPU, and the interleaved order spreads its
drift over all of them.

Timings that run at once on one host (two workers' gates, a post-validation beside a gate) each take a CPU of their
own: a CPU is leased by binding an abstract UNIX socket named for it, which needs no file anyone could plant and is
released when the socket closes or its process dies. When every CPU is leased the timing shares the last one.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def _lease(cpus: set[int]) -> tuple[int, socket.socket | None]:
    """The highest of `cpus` that no other timing on this host holds, with the socket that holds it (None: all
    were held, and the highest is shared)."""
    for cpu in sorted(cpus, reverse=True):
        lease = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            lease.bind(f"\0seis-timing-cpu-{cpu}")
            return cpu, lease
        except OSError:  # held by another timing, in this process or another
            lease.close()
    return max(cpus), None


@contextmanager
def pinned_together(pids: Iterable[int]) -> Iterator[int | None]:
    """Pin every thread of `pids` to one CPU for the block: the highest this process may use that no other
    timing on the host holds. Yields the CPU, or None where affinity cannot be set (another OS, a denied call).
    Previous masks are restored and the CPU released afterwards."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    cpu, lease = _lease(os.sched_getaffinity(0))
    saved: dict[int, set[int]] = {}
    try:
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
    finally:
        if lease is not None:
            lease.close()


def _restore(saved: dict[int, set[int]]) -> None:
    for tid, mask in saved.items():
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            pass  # the thread or process is gone
