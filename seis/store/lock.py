"""An inter-process file lock (flock), with a timeout: DVC must never run twice at once in one repository."""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


class LockTimeout(TimeoutError):
    pass


class FileLock:
    """Exclusive lock on `path` (created if missing). Also excludes other threads: each holds its own open file."""

    def __init__(self, path: str | Path, timeout_s: float = 600.0, poll_s: float = 0.05):
        self.path, self.timeout_s, self.poll_s = Path(path), timeout_s, poll_s
        self._fd: int | None = None

    def __enter__(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise LockTimeout(f"could not lock {self.path} within {self.timeout_s:.0f} s") from None
                time.sleep(self.poll_s)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
