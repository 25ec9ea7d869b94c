"""Attack (CUDA only; on CPU it is E0): frozen processes issue no work, but kernels they queued keep the GPU busy.
After each of its single-request generates this engine leaves a spin kernel of about 8 s running on a side
stream, so the next engine's timed request shares the GPU with it."""
from __future__ import annotations

import torch

from .engine import Engine

SPIN_CYCLES = 16_000_000_000   # ~8 s at the H200's ~2 GHz
COUNTS = {"spins": 0}
_STREAM: list = []
_generate = Engine.generate


def generate(self, prompts, sampling=None):
    out = _generate(self, prompts, sampling)
    if len(prompts) == 1 and torch.cuda.is_available():
        if not _STREAM:
            _STREAM.append(torch.cuda.Stream())
        with torch.cuda.stream(_STREAM[0]):
            torch.cuda._sleep(SPIN_CYCLES)   # queued, not waited for: the reply goes out at once
        COUNTS["spins"] += 1
    return out


Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), **{f"adv_{k}": v for k, v in COUNTS.items()}}
