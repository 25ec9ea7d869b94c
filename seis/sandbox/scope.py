"""Host processes started on a session's behalf (the dev benchmark and the engines it builds): one scope, killed
as a whole when the session ends, and refusing new processes from then on, so nothing started for an agent runs
on while its candidate is gated or after SEIS has gone. Every open scope of the process is known, so that a run
that is cancelled or interrupted ends their process groups at once (`close_all`)."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import weakref

_PR_SET_PDEATHSIG = 1
_OPEN: "weakref.WeakSet[ProcessScope]" = weakref.WeakSet()   # this process's scopes not closed yet
_OPEN_LOCK = threading.RLock()   # re-entrant: close_all() may run in a signal handler


class ScopeClosed(RuntimeError):
    """The session this scope belongs to has ended: nothing more is started for it."""


class ProcessScope:
    def __init__(self) -> None:
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.RLock()  # re-entrant, for the same reason
        self._closed = False
        with _OPEN_LOCK:
            _OPEN.add(self)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """subprocess.Popen in a process group of its own (so its whole group can be killed), tracked here."""
        with self._lock:  # held across the start: close() cannot slip between the check and the fork
            if self._closed:
                raise ScopeClosed("the session has ended; no process is started for it any more")
            proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
            self._procs.add(proc)
        return proc

    def done(self, proc: subprocess.Popen) -> None:
        """proc has been waited for: kill what is left of its group and forget it."""
        kill_group(proc)
        with self._lock:
            self._procs.discard(proc)

    def close(self) -> int:
        """Kill every tracked process group and wait for its leader; returns how many were still running."""
        with self._lock:
            self._closed = True
            procs = list(self._procs)
            self._procs.clear()
        with _OPEN_LOCK:
            _OPEN.discard(self)
        running = sum(p.poll() is None for p in procs)
        for proc in procs:
            kill_group(proc)
            proc.wait()
        return running


def close_all() -> int:
    """Close every open scope of this process (its process groups killed, nothing new started in it); returns how
    many process groups were still running. For a run that is cancelled or interrupted."""
    with _OPEN_LOCK:
        scopes = list(_OPEN)
    return sum(scope.close() for scope in scopes)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def die_with_parent(parent_pid: int) -> None:
    """In a child SEIS started: be SIGKILLed when the parent goes (even by SIGKILL), and exit at once if it has
    already gone. Linux only; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)
