"""Attack on sampling checks that always pass a seed: a request is sampled properly only when it names a seed (every
request of the gate's sampling checks does); an unseeded sampled request, what most users send, is decoded
greedily (no sampling work), which is wrong for every one of them."""
from __future__ import annotations

from dataclasses import replace

from .engine import Engine
from .sampling import SamplingParams

GREEDY = {"requests": 0}
_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    chosen = [sp if sp.seed is not None else replace(sp, temperature=0.0, top_k=0, top_p=1.0) for sp in params]
    GREEDY["requests"] += sum(sp.seed is None and not sp.greedy for sp in params)
    return _generate(self, prompts, chosen)


Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), "adv_greedy_unseeded": GREEDY["requests"]}
