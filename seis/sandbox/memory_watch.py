"""A bound on the host memory a sandbox's processes hold together, where no memory cgroup can give one (a host that
lets SEIS make none: non-root, cgroup v2 without delegation, the GPU hosts of docs/benchmarks.md).

Every WATCH_PERIOD_S the proportional set size of each process of the sandbox is summed (PSS: a page shared by n
processes counts 1/n to each, so a pool of forked workers is not counted n times over); past the bound the
sandbox is killed. A sandbox can overshoot by what it allocates between two looks. Its RAM-backed /tmp and
/dev/shm are not process memory: their sizes bound them. Where the host runs out all the same, the kernel's OOM
killer takes a sandbox's process first (seis.sandbox.process.OOM_SCORE_ADJ)."""
from __future__ import annotations

import threading
from collections.abc import Callable

WATCH_PERIOD_S = 1.0


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


class MemoryWatch:
    """Calls `kill` once the processes `members()` names hold more than `limit_bytes` together; `exceeded` then
    says what they held (None: they never did). Runs until `stop()` or its kill."""

    def __init__(self, members: Callable[[], list[int]], kill: Callable[[], None], limit_bytes: int):
        self.members, self.kill, self.limit_bytes = members, kill, limit_bytes
        self.exceeded: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_PERIOD_S):
            held = sum(pss_bytes(pid) for pid in self.members())
            if held > self.limit_bytes:
                self.exceeded = (f"its processes held {held / 2**30:.1f} GiB of host memory, past the sandbox's bound "
                                 f"of {self.limit_bytes / 2**30:.1f} GiB: the watch killed it")
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
