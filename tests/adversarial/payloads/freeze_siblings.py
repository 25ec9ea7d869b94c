"""Attack: after each of its own single-request generates (how requests are timed), SIGSTOP the other engines of
the gate (found in /proc: same parent, Python) for twice as long as its own request took, then SIGCONT them --
so the engine timed next (parent / vanilla) is charged for the pause. It also keeps them stopped while it runs
its own next request, so they cannot compete for the shared CPU.

Every visible pid is probed with signal 0 (how many it *could* stop); only this gate's own engines are stopped."""
from __future__ import annotations

import atexit
import os
import signal
import threading
import time

from . import _adv_common as C
from .engine import Engine

_SIBLINGS: list[int] = []


def others() -> list[int]:
    """The gate's other engines (looked up once: scanning /proc takes milliseconds)."""
    if not _SIBLINGS:
        _SIBLINGS.extend(C.siblings())
    return _SIBLINGS

STOPPED: set[int] = set()
LOCK = threading.Lock()
COUNTS = {"stops": 0, "signalable_pids": 0, "visible_pids": 0}


def _stop(pids) -> None:
    with LOCK:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                STOPPED.add(pid)
                COUNTS["stops"] += 1
            except OSError:
                pass


def _cont() -> None:
    with LOCK:
        for pid in list(STOPPED):
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
            STOPPED.discard(pid)


atexit.register(_cont)


def _pause_others(seconds: float) -> None:
    time.sleep(0.002)  # let the reply reach the host first
    _stop(others())
    time.sleep(seconds)
    _cont()


_generate = Engine.generate


def generate(self, prompts, sampling=None):
    single = len(prompts) == 1
    if single:
        _stop(others())   # nobody else runs while I am timed
    t0 = time.perf_counter()
    try:
        out = _generate(self, prompts, sampling)
    finally:
        _cont()
    if single:
        threading.Thread(target=_pause_others, args=(min(2.0, max(0.02, 2 * (time.perf_counter() - t0))),),
                         daemon=True).start()
    return out


Engine.generate = generate
_stats = Engine.stats


def stats(self):
    visible = C.pids()
    COUNTS.update(visible_pids=len(visible), signalable_pids=C.signalable(visible))
    return {**_stats(self), **{f"adv_{k}": v for k, v in COUNTS.items()}}


Engine.stats = stats
