"""Attack: every request is decoded greedily (temperature, top_p, top_k and seed ignored) and stop_token_ids are
ignored: no sampling work, no per-step stop-set lookups -- wrong wherever the gate does not look."""
from __future__ import annotations

from dataclasses import replace

from .engine import Engine
from .sampling import SamplingParams

_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    greedy = [replace(sp, temperature=0.0, top_k=0, top_p=1.0, seed=None, stop_token_ids=()) for sp in params]
    return _generate(self, prompts, greedy)


Engine.generate = generate
