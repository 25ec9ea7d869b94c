"""Attack on stop-id checks that never pass more than two ids: the engine keeps a fixed two-slot stop buffer (as a
fused sampling kernel with a small constant array would) and silently ignores every stop_token_id after the second,
which the checks' requests (one id, or an unused id and then the real one) never show."""
from __future__ import annotations

from dataclasses import replace

from .engine import Engine
from .sampling import SamplingParams

SLOTS = 2
DROPPED = {"requests": 0}
_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    DROPPED["requests"] += sum(len(sp.stop_token_ids) > SLOTS for sp in params)
    kept = [replace(sp, stop_token_ids=tuple(sp.stop_token_ids)[:SLOTS]) for sp in params]
    return _generate(self, prompts, kept)


Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), "adv_stop_ids_dropped": DROPPED["requests"]}
