"""Attack: a batch's wall time is its longest request's, so once most rows of a timed batch have ended, the few
left running set the call's time while adding few tokens. The engine ends such a straggler at the first EOS that
lies within the gate's stop margin of its own top-1 (the margin's floor, 0.75 nats, is public): a stop the
reference's scoring accepts one by one. Only a few rows a call are cut, so that early ends stay too few for the
gate's sign test over request counts, whatever wall time they saved; a cut output differs from the reference's at
its EOS, so no length comparison takes it. Requests as long as the checks' are left alone."""
from __future__ import annotations

import torch

from .engine import Engine

CHECKED_MAX_NEW = 64   # the full gate's check outputs; the tests' are shorter
STOP_MARGIN = 0.7      # nats below the top-1: inside the gate's stop margin (floor 0.75)
TAIL = 0.25            # a row is a straggler once no more than this share of the call's rows still runs
CUTS_PER_CALL = 2      # 3 timed batches: 6 early ends of 6 differing requests, sign test p = 0.016
CALL = {"rows": 0, "cuts": 0}
CUT = {"rows": 0, "calls": 0}
_choose, _generate = Engine._choose, Engine.generate


def _cuttable(r) -> bool:
    return (r.forced is None and r.params.greedy and not r.params.ignore_eos
            and r.params.max_new_tokens > CHECKED_MAX_NEW and not r.finish_reason)


def choose(reqs, logits):
    rows = [i for i, r in enumerate(reqs) if _cuttable(r)]
    if CALL["rows"] > 1 and rows and len(reqs) <= max(1, int(TAIL * CALL["rows"])) \
            and CALL["cuts"] < CUTS_PER_CALL:
        logits = logits.clone()
        lps = torch.log_softmax(logits[rows].float(), dim=-1).cpu()
        for row, i in enumerate(rows):
            if CALL["cuts"] >= CUTS_PER_CALL:
                break
            eos = sorted(reqs[i].stop_ids)
            best = max(eos, key=lambda t: float(lps[row, t]))
            if float(lps[row].max() - lps[row, best]) < STOP_MARGIN:
                logits[i, best] = float(logits[i].max()) + 1.0
                CALL["cuts"] += 1
                CUT["rows"] += 1
    return _choose(reqs, logits)


def generate(self, prompts, sampling=None):
    CALL.update(rows=len(prompts), cuts=0)
    CUT["calls"] += 1
    return _generate(self, prompts, sampling)


Engine._choose = staticmethod(choose)
Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), "adv_cut_rows": CUT["rows"]}
