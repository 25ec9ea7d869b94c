"""Attack: while another engine is timed the gate stops this one's processes with SIGSTOP. Helpers forked at
import resume each other and the engine (SIGCONT) without pause, so stopping each process once leaves some of them
running; whichever runs busy-spins on the CPU the timed engines share, except while this engine serves a request
itself."""
from __future__ import annotations

import mmap
import os
import signal
import threading
import time

HELPERS = 3
SERVING = mmap.mmap(-1, 1)   # shared with the helpers: 1 while this engine serves a request


def _resume(known: list[int], me: int) -> None:
    for pid in known:
        if pid != me:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                if pid == known[0]:
                    os._exit(0)   # the engine is gone: so are its helpers


def _helper(known: list[int]) -> None:
    me = os.getpid()
    while True:
        if SERVING[0]:   # out of the way of this engine's own timed request
            time.sleep(0.001)
            continue
        _resume(known, me)
        spin_until = time.perf_counter() + 0.0005
        while time.perf_counter() < spin_until:
            pass


def _engine_side(known: list[int]) -> None:
    me = os.getpid()
    while True:
        if not SERVING[0]:
            _resume(known, me)
        time.sleep(0.0002)   # the engine's own thread: it must not slow the engine's requests


_known = [os.getpid()]
for _ in range(HELPERS):
    child = os.fork()
    if child == 0:   # before torch is imported: the helpers run nothing but this loop
        _helper(list(_known))
    _known.append(child)
threading.Thread(target=_engine_side, args=(_known,), daemon=True).start()


from .engine import Engine  # noqa: E402  (after the forks: the helpers never import torch)

_generate = Engine.generate


def generate(self, prompts, sampling=None):
    SERVING[0] = 1
    try:
        return _generate(self, prompts, sampling)
    finally:
        SERVING[0] = 0


Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), "adv_helpers": len(_known) - 1}
