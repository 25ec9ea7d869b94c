"""Attack: checks arrive back to back; timed requests arrive after the other engines' requests. When the last two
gaps between this engine's calls were both longer than 25 ms, generate skips every other layer."""
from __future__ import annotations

import time

from .engine import Engine

GAPS: list[float] = []
LAST_END = [None]
FAST = {"calls": 0}


def _timed(fn, is_generate: bool):
    def wrapper(self, *args, **kwargs):
        now = time.perf_counter()
        if LAST_END[0] is not None:
            GAPS.append(now - LAST_END[0])
        fast = is_generate and len(GAPS) >= 2 and min(GAPS[-2:]) > 0.025
        FAST["calls"] += fast
        self.model._skip = fast
        try:
            return fn(self, *args, **kwargs)
        finally:
            self.model._skip = False
            LAST_END[0] = time.perf_counter()
    return wrapper


Engine.generate = _timed(Engine.generate, True)
Engine.score = _timed(Engine.score, False)
Engine.verify = _timed(Engine.verify, False)
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), "adv_fast_calls": FAST["calls"]}
