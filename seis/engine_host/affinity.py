"""Run timed engine processes on one shared CPU.

Each engine's host loop (scheduling, metadata, one synchronisation per decode step) runs on whichever CPU the
kernel placed its process. On a virtual machine the CPUs differ from moment to moment (steal time, clocks), and
a process tends to stay where it was placed, so identical engines measured 5-7 % apart. Timed requests run one
at a time, so all engines can share one CPU: they then see the same CPU, and the interleaved order spreads its
drift over all of them.

Timings that run at once on one host (two workers' gates, a post-validation beside a gate) each take a CPU of their
own: a CPU is leased by binding an abstract UNIX socket named for it, which needs no file anyone could plant and is
released when the socket closes or its process dies. When every CPU is leased the timing shares the last one.

The pin holds because engine sandboxes cannot change their own affinity (seis.sandbox.seccomp, fixed_cpus) and
what a pinned thread starts inherits its mask; pinned_frozen lists and pins an engine's threads while the engine is
frozen, so none is started between the listing and the pin.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Protocol

# Listings of the threads to pin, at most, until one finds every thread pinned already: a thread an unpinned one
# started while it was listed is found by the next. A frozen engine starts none; past the last listing the timing
# goes on with what was pinned.
PIN_ROUNDS = 8


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
def pinned_together(pids: Iterable[int] | Callable[[], Iterable[int]]) -> Iterator[int | None]:
    """Pin every thread of `pids` (or of the pids a function lists, called for each listing) to one CPU for the
    block: the highest this process may use that no other timing on the host holds. Threads are listed again until
    a listing finds all of them pinned (PIN_ROUNDS); one that ends meanwhile is passed over. Yields the CPU, or None
    where affinity cannot be set (another OS, a denied call). Previous masks are restored and the CPU released
    afterwards."""
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    listing = pids if callable(pids) else (lambda fixed=list(pids): fixed)
    ours = os.sched_getaffinity(0)
    cpu, lease = _lease(ours)
    saved: dict[int, set[int]] = {}
    try:
        try:
            _pin(listing, cpu, saved)
        except OSError:  # no permission: measure unpinned
            _restore(saved)
            yield None
            return
        try:
            yield cpu
        finally:
            _restore(saved)
            _release_new(listing, cpu, saved, ours)
    finally:
        if lease is not None:
            lease.close()


def _pin(listing: Callable[[], Iterable[int]], cpu: int, saved: dict[int, set[int]]) -> None:
    for _ in range(PIN_ROUNDS):
        pinned = 0
        for pid in listing():
            for tid in _threads(pid):
                try:
                    mask = os.sched_getaffinity(tid)
                    if mask != {cpu}:
                        os.sched_setaffinity(tid, {cpu})
                        saved.setdefault(tid, mask)
                        pinned += 1
                except ProcessLookupError:  # the thread ended meanwhile
                    continue
        if not pinned:
            return


class Freezable(Protocol):
    def freeze(self) -> object: ...

    def thaw(self) -> object: ...


@contextmanager
def pinned_frozen(engines: Sequence[Freezable], pids: Callable[[], Iterable[int]]) -> Iterator[int | None]:
    """pinned_together(pids) for the block, its threads listed and pinned while every one of `engines` is frozen
    (all thawed again before the block runs): a stopped process starts no thread or process, so none escapes the
    listing, and none can fork while it runs. Each engine's own freeze() and thaw() deal with one that resists or
    ran while frozen; the first error of a thaw is raised once all were thawed."""
    with ExitStack() as stack:
        frozen: list[Freezable] = []
        try:
            for engine in engines:
                engine.freeze()
                frozen.append(engine)
            cpu = stack.enter_context(pinned_together(pids))
        finally:
            _thaw_all(frozen)
        yield cpu


def _thaw_all(engines: list[Freezable]) -> None:
    error: BaseException | None = None
    for engine in engines:
        try:
            engine.thaw()
        except BaseException as e:  # thaw the others all the same
            error = error or e
    if error is not None:
        raise error


def _release_new(listing: Callable[[], Iterable[int]], cpu: int, saved: dict[int, set[int]],
                 ours: set[int]) -> None:
    """Threads started while pinned inherited the one CPU, and an engine sandbox cannot widen a mask itself: give
    them their process's mask from before (a process started meanwhile: this process's)."""
    for pid in listing():
        for tid in _threads(pid):
            try:
                if tid not in saved and os.sched_getaffinity(tid) == {cpu}:
                    os.sched_setaffinity(tid, saved.get(pid, ours))
            except OSError:
                pass  # the thread ended meanwhile


def _restore(saved: dict[int, set[int]]) -> None:
    for tid, mask in saved.items():
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            pass  # the thread or process is gone
