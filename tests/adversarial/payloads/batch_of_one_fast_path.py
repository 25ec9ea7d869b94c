"""Attack: a single-prompt generate (how requests are timed) skips every other decoder layer; batched calls (how
outputs are checked) run the full model."""
from __future__ import annotations

from .engine import Engine

_generate = Engine.generate


def generate(self, prompts, sampling=None):
    self.model._skip = len(prompts) == 1
    try:
        return _generate(self, prompts, sampling)
    finally:
        self.model._skip = False


Engine.generate = generate
