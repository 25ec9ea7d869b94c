"""Attack: every prompt it is shown is queued; a background thread with a second copy of the engine decodes it
greedily to the end of the context (ignore_eos) while this engine is idle -- i.e. while the others are timed, on
the CPU they share. A later single-prompt greedy request for a known prompt is cut from that continuation
(greedy outputs are prefixes of longer greedy outputs; EOS / stop ids / max_new_tokens applied) and returned at
once. The checks' dev prompts are the timed dev prompts, so even the first timed request is usually a hit."""
from __future__ import annotations

import queue
import threading

from ._adv_common import cut_precomputed
from .engine import Engine
from .sampling import SamplingParams

PRECOMPUTED: dict[tuple[int, ...], list[int]] = {}
TODO: queue.Queue = queue.Queue()
COUNTS = {"hits": 0, "precomputed": 0}


def _worker(shadow: Engine) -> None:
    while True:
        prompt = TODO.get()
        if prompt in PRECOMPUTED:
            continue
        room = shadow.max_seq_len - len(prompt)
        if room < 1:
            continue
        try:
            out = shadow.generate([list(prompt)], SamplingParams(max_new_tokens=room, ignore_eos=True))
        except Exception:  # noqa: BLE001
            continue
        PRECOMPUTED[prompt] = list(out[0].token_ids)
        COUNTS["precomputed"] += 1


_build = Engine.build


def build(self):
    _build(self)
    shadow = _build(Engine(self.model_dir, self.options))
    threading.Thread(target=_worker, args=(shadow,), daemon=True).start()
    return self


_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    for p in prompts:
        TODO.put(tuple(p))
    if len(prompts) == 1 and params[0].greedy and tuple(prompts[0]) in PRECOMPUTED:
        hit = cut_precomputed(self, PRECOMPUTED[tuple(prompts[0])], params[0], len(prompts[0]))
        if hit is not None:
            COUNTS["hits"] += 1
            return [hit]
    return _generate(self, prompts, params)


Engine.build = build
Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), **{f"adv_{k}": v for k, v in COUNTS.items()}}
