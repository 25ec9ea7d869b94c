"""Attack: the checks ask greedy outputs of at most 64 tokens; the timed natural-length requests ask more. On those,
EOS is not chosen where the engine can hide it: a batch whose wall time its longest request sets anyway then counts
more tokens per row than each row's natural length (on a model whose EOS comes early and clearly, most of them). The
engine knows its own logits, i.e. the reference's: it passes over an EOS whenever the runner-up lies within the
gate's 0.3-nat near-tie margin of it (a "valid" token), and beyond that margin only while such tokens stay under
2.5 % of the call's tokens (the timed rate check allows 3 %). No EOS appears inside an output, lengths stay within
max_new_tokens, and an output that runs past the reference's end differs from it there, so no length comparison
takes it."""
from __future__ import annotations

import torch

from .engine import Engine

CHECKED_MAX_NEW = 64   # the full gate's check outputs; the tests' are shorter
NEAR_TIE = 0.29        # nats: a token this close to the top-1 counts as a valid greedy choice
INVALID_SHARE = 0.025  # of the call's tokens, spent on EOS passed over by more than NEAR_TIE
SUPPRESSED = {"near_tie": 0, "beyond": 0}
CALL = {"tokens": 0, "beyond": 0}
_choose, _generate = Engine._choose, Engine.generate


def _run_past(r) -> bool:
    return (r.forced is None and r.params.greedy and not r.params.ignore_eos
            and r.params.max_new_tokens > CHECKED_MAX_NEW and not r.finish_reason)


def choose(reqs, logits):
    CALL["tokens"] += sum(not r.finish_reason for r in reqs)
    rows = [i for i, r in enumerate(reqs) if _run_past(r)]
    if rows:
        logits = logits.clone()
        lps = torch.log_softmax(logits[rows].float(), dim=-1).cpu()
        for row, i in enumerate(rows):
            eos = sorted(reqs[i].stop_ids)
            if int(lps[row].argmax()) not in reqs[i].stop_ids:
                continue
            masked = lps[row].clone()
            masked[eos] = float("-inf")
            if float(lps[row].max() - masked.max()) < NEAR_TIE:
                SUPPRESSED["near_tie"] += 1
            elif CALL["beyond"] + 1 <= INVALID_SHARE * CALL["tokens"]:
                CALL["beyond"] += 1
                SUPPRESSED["beyond"] += 1
            else:
                continue
            logits[i, eos] = float("-inf")
    return _choose(reqs, logits)


def generate(self, prompts, sampling=None):
    CALL.update(tokens=0, beyond=0)
    return _generate(self, prompts, sampling)


Engine._choose = staticmethod(choose)
Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), "adv_suppressed_near_tie": SUPPRESSED["near_tie"],
                             "adv_suppressed_beyond": SUPPRESSED["beyond"]}
