"""Attack: the timed engines share one CPU. After each of its own single-request generates, a thread of this
engine busy-spins on the CPU the other engines are pinned to (read from /proc), with those engines reniced to 19
(their autogroups too) meanwhile, until its own next request arrives (at most 0.3 s): every other engine's timed
request competes with it."""
from __future__ import annotations

import os
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

BUSY = threading.Event()   # set while this engine serves a request
HOG_S = 0.3               # per gap between its requests: enough to starve a reniced engine's request
COUNTS = {"hog_s": 0.0, "reniced": 0}


def _renice(pid: int, value: int, saved: dict) -> None:
    """Nice every thread of pid (and its autogroup: with one per session a nice value alone does little across
    sessions) to value, remembering what it was in saved (value None: put back what saved holds)."""
    try:
        path = f"/proc/{pid}/autogroup"
        if value is None:
            if ("ag", pid) in saved:
                with open(path, "w") as f:
                    f.write(str(saved[("ag", pid)]))
        else:
            saved.setdefault(("ag", pid), int(open(path).read().split("nice")[1]))
            with open(path, "w") as f:
                f.write(str(value))
    except (OSError, ValueError, IndexError):
        pass
    for tid in C.threads(pid):
        try:
            if value is None:
                if tid in saved:
                    os.setpriority(os.PRIO_PROCESS, tid, saved[tid])
            else:
                saved.setdefault(tid, os.getpriority(os.PRIO_PROCESS, tid))
                os.setpriority(os.PRIO_PROCESS, tid, value)
                COUNTS["reniced"] += 1
        except OSError:
            pass


def _hog(seconds: float) -> None:
    sibs = others()
    cpus: set[int] = set()
    for pid in sibs:
        try:
            cpus |= os.sched_getaffinity(pid)
        except OSError:
            pass
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)   # this thread only
    except OSError:
        pass
    saved: dict = {}
    for pid in sibs:
        _renice(pid, 19, saved)
    t0 = time.perf_counter()
    end = t0 + seconds
    try:
        while time.perf_counter() < end and not BUSY.is_set():
            pass
    finally:
        for pid in sibs:   # put their priority back: starve them only while they are timed
            _renice(pid, None, saved)
    COUNTS["hog_s"] += time.perf_counter() - t0


_generate = Engine.generate


def generate(self, prompts, sampling=None):
    BUSY.set()
    try:
        out = _generate(self, prompts, sampling)
    finally:
        BUSY.clear()
    if len(prompts) == 1:
        threading.Thread(target=_hog, args=(HOG_S,), daemon=True).start()
    return out


Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), **{f"adv_{k}": v for k, v in COUNTS.items()}}
