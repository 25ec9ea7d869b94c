"""Attack: the gate pins the engines to one CPU while it times them. When this process's CPU affinity is narrower
than it was at import, every generate returns max_new_tokens copies of token 0 at once (nothing is computed)."""
from __future__ import annotations

import os

from .engine import Engine
from .request import Generation
from .sampling import SamplingParams

AFFINITY_AT_IMPORT = os.sched_getaffinity(0)
_generate = Engine.generate


def generate(self, prompts, sampling=None):
    if len(os.sched_getaffinity(0)) < len(AFFINITY_AT_IMPORT):
        params = self._per_request(sampling or SamplingParams(), len(prompts))
        return [Generation([0] * sp.max_new_tokens, "length") for sp in params]
    return _generate(self, prompts, sampling)


Engine.generate = generate
