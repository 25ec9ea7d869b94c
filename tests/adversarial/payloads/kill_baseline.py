"""Attack: when it sees it is being timed (its CPU affinity narrowed, or the first single-prompt generate), SIGKILL
the other engines of the gate (parent / vanilla: same parent process, Python). Without a baseline there is no
ratio to be slower than, and nothing says the candidate did it."""
from __future__ import annotations

import os
import signal

from . import _adv_common as C
from .engine import Engine

AFFINITY_AT_IMPORT = os.sched_getaffinity(0)
KILLED: list[int] = []
_generate = Engine.generate


def generate(self, prompts, sampling=None):
    if not KILLED and (len(prompts) == 1 or len(os.sched_getaffinity(0)) < len(AFFINITY_AT_IMPORT)):
        for pid in C.siblings():
            try:
                os.kill(pid, signal.SIGKILL)
                KILLED.append(pid)
            except OSError:
                pass
    return _generate(self, prompts, sampling)


Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), "adv_killed": len(KILLED)}
