"""A bound on the host memory a sandbox holds, where no memory cgroup can give one (a host that lets SEIS make
none: non-root, cgroup v2 without delegation, the GPU hosts of docs/benchmarks.md).

Two looks, every WATCH_PERIOD_S. The proportional set size of each process of the sandbox is summed (PSS: a page
shared by n processes counts 1/n to each, so a pool of forked workers is not counted n times over); past the
bound the sandbox is killed. That names what a sandbox holds, but only memory its processes map: a memfd or a
SysV segment held without a mapping is no process's, and its RAM-backed /tmp and /dev/shm count only against
their sizes. So the watch also reads the host's available memory, which nothing in a sandbox can hide from:
under a floor, and down by more than a margin since the watch began, the sandbox is killed, whoever took it.
A sandbox can overshoot by what it takes between two looks; where the host runs out all the same, the kernel's
OOM killer takes a sandbox's process first (seis.sandbox.process.OOM_SCORE_ADJ)."""
from __future__ import annotations

import threading
from collections.abc import Callable

WATCH_PERIOD_S = 1.0
FLOOR_DROP_MARGIN = 2**30   # what a sandbox may take from a host that is already under the floor when it starts


def pss_bytes(pid: int) -> int:
    """The process's proportional set size, from the kernel's /proc/<pid>/smaps_rollup; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo: what the host can still give without swapping (None where it does not say)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_floor_bytes() -> int:
    """The host's available memory under which a watched sandbox that took it is killed: a sixteenth of the host,
    at least 2 GiB."""
    from .cgroup import host_memory_bytes
    return max(2 * 2**30, host_memory_bytes() // 16)


def below_floor(at_start: int | None, now: int | None) -> str | None:
    """Why the host's available memory is past the floor (under it, and FLOOR_DROP_MARGIN below where it was when
    the watch began), or None."""
    floor = memory_floor_bytes()
    if at_start is None or now is None or now >= floor or at_start - now <= FLOOR_DROP_MARGIN:
        return None
    return (f"the host's available memory fell under {floor / 2**30:.1f} GiB ({(at_start - now) / 2**30:.1f} GiB "
            f"taken since the sandbox started, mapped by its processes or not): the watch killed it")


class MemoryWatch:
    """Calls `kill` once the processes `members()` names hold more than `limit_bytes` together, or the host's
    available memory is past its floor (below_floor); `exceeded` then says which (None: neither came). Runs until
    `stop()` or its kill."""

    def __init__(self, members: Callable[[], list[int]], kill: Callable[[], None], limit_bytes: int):
        self.members, self.kill, self.limit_bytes = members, kill, limit_bytes
        self.exceeded: str | None = None
        self._available_at_start = host_available_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_PERIOD_S):
            held = sum(pss_bytes(pid) for pid in self.members())
            why = (f"its processes held {held / 2**30:.1f} GiB of host memory, past the sandbox's bound of "
                   f"{self.limit_bytes / 2**30:.1f} GiB: the watch killed it") if held > self.limit_bytes else None
            why = why or below_floor(self._available_at_start, host_available_bytes())
            if why:
                self.exceeded = why
                try:
                    self.kill()
                except Exception:  # noqa: BLE001 - the owner's own kill() reports survivors
                    pass
                return

    def stop(self, wait: bool = True) -> None:
        """Stop looking; with `wait`, return once it has (at once when called from its own kill)."""
        self._stop.set()
        if wait and self._thread is not threading.current_thread():
            self._thread.join()
