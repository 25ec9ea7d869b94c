"""An inter-process file lock with a timeout (the `filelock` package): DVC must never run twice at once in one
repository, a snapshot is stored once, and a run directory has one flow at a time."""
from __future__ import annotations

from pathlib import Path

import filelock


class LockTimeout(TimeoutError):
    pass


class FileLock:
    """Exclusive lock on `path` (created if missing). Also excludes other threads: each instance holds its own
    open file. `timeout_s=0` tries once."""

    def __init__(self, path: str | Path, timeout_s: float = 600.0, poll_s: float = 0.05):
        self.path, self.timeout_s, self.poll_s = Path(path), timeout_s, poll_s
        self._lock: filelock.BaseFileLock | None = None

    def __enter__(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(self.path), thread_local=False)
        try:
            lock.acquire(timeout=self.timeout_s, poll_interval=self.poll_s)
        except filelock.Timeout:
            raise LockTimeout(f"could not lock {self.path} within {self.timeout_s:.0f} s") from None
        self._lock = lock
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
