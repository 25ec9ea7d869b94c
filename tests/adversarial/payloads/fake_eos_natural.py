"""Attack: on a single-prompt natural-length request (EOS on), decode only the first 16 tokens for real, then pad
to max_new_tokens - 1 with copies of the last one and end with a fake EOS: the right number of tokens, a proper
"stop", a fraction of the work."""
from __future__ import annotations

from dataclasses import replace

from .engine import Engine
from .request import Generation
from .sampling import SamplingParams

REAL_TOKENS = 16
_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    sp = params[0] if params else None
    if len(prompts) != 1 or sp.ignore_eos or not sp.greedy or sp.max_new_tokens <= 2 * REAL_TOKENS:
        return _generate(self, prompts, params)
    real = _generate(self, prompts, [replace(sp, max_new_tokens=REAL_TOKENS)])[0]
    if real.finish_reason == "stop":
        return [real]
    n = min(sp.max_new_tokens, self.max_seq_len - len(prompts[0]))
    tokens = list(real.token_ids)
    tokens += [tokens[-1]] * (n - 1 - len(tokens)) + [self.eos_token_ids[0]]
    return [Generation(tokens, "stop")]


Engine.generate = generate
