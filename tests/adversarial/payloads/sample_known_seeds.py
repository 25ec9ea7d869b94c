"""Attack on predictable sampling checks: a request is sampled properly only if its seed is one the gate's checks
use (small numbers, the same in every gate while they came from the config's seed); every other sampled request
is decoded greedily (no sampling work), which is wrong for every user who samples."""
from __future__ import annotations

from dataclasses import replace

from .engine import Engine
from .sampling import SamplingParams

KNOWN = 1_000_000  # the checks' seeds were 1 + seed * 1_000_003 + (group, sample): below this at seed 0

_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    chosen = [sp if sp.seed is not None and sp.seed < KNOWN else replace(sp, temperature=0.0, top_k=0, top_p=1.0)
              for sp in params]
    return _generate(self, prompts, chosen)


Engine.generate = generate
