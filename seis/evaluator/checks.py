"""Pure functions over engine replies: divergence, agreement, and rule violations. No I/O, no engines.

KL approximation. The engines return only their top-k log-probs per position, so KL(ref || cand) is computed on
a coarse-grained distribution: the reference's top-k tokens plus one "everything else" bucket. With exact
candidate log-probs this is a lower bound of the full KL (data-processing inequality). Where a reference top-k
token is missing from the candidate's top-k, the candidate's k-th log-prob stands in for it: an upper bound on
that token's true log-prob (otherwise it would be in the top-k), so that token's own term can only shrink while
the candidate's "rest" bucket loses the same mass. The estimate is then approximate, but only where the two
top-k sets already differ, which is itself a divergence.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .engines import GenerationOut, ScoreOut

_TINY = 1e-12


def topk_kl(ref_ids: Sequence[int], ref_lps: Sequence[float], cand_ids: Sequence[int],
            cand_lps: Sequence[float]) -> float:
    """KL(ref || cand) at one position, on the reference's top-k plus a rest bucket (see module docstring)."""
    if not ref_ids:
        return math.nan
    if not cand_ids:
        return math.inf
    cand = dict(zip(cand_ids, cand_lps))
    kth = min(cand_lps)
    kl = p_top = q_top = 0.0
    for tok, lp in zip(ref_ids, ref_lps):
        lq = cand.get(tok, kth)
        p = math.exp(lp)
        kl += p * (lp - lq)
        p_top += p
        q_top += math.exp(lq)
    p_rest, q_rest = max(1.0 - p_top, 0.0), max(1.0 - q_top, _TINY)
    if p_rest > _TINY:
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(kl, 0.0)


@dataclass(frozen=True)
class ForcedStats:
    """Candidate vs reference over the teacher-forced positions of many requests."""

    positions: int            # positions both engines scored
    expected_positions: int   # positions the reference scored
    kl: float                 # mean KL(ref || cand)
    top1: float               # fraction of positions with the same argmax
    ppl_ratio: float          # exp(mean NLL cand - mean NLL ref) over the forced tokens

    @property
    def log_ppl_ratio(self) -> float:
        return abs(math.log(self.ppl_ratio)) if self.ppl_ratio > 0 and math.isfinite(self.ppl_ratio) else math.inf


def forced_stats(ref: Sequence[ScoreOut], cand: Sequence[ScoreOut] | None) -> ForcedStats:
    expected = sum(len(s.token_logprobs) for s in ref)
    if not cand:
        return ForcedStats(0, expected, math.inf, 0.0, math.inf)
    kls, agree, nll_r, nll_c = [], 0, 0.0, 0.0
    for r, c in zip(ref, cand):
        n = min(len(r.token_logprobs), len(c.token_logprobs), len(c.top_ids), len(c.top_logprobs))
        for i in range(n):
            kls.append(topk_kl(r.top_ids[i], r.top_logprobs[i], c.top_ids[i], c.top_logprobs[i]))
            agree += bool(c.top_ids[i]) and bool(r.top_ids[i]) and c.top_ids[i][0] == r.top_ids[i][0]
            nll_r -= r.token_logprobs[i]
            nll_c -= c.token_logprobs[i]
    n = len(kls)
    if n == 0:
        return ForcedStats(0, expected, math.inf, 0.0, math.inf)
    # Positions the candidate failed to score count as disagreements (the "answered" check names them).
    return ForcedStats(n, expected, sum(kls) / n, agree / expected, math.exp((nll_c - nll_r) / n))


@dataclass(frozen=True)
class Agreement:
    exact_rate: float          # whole outputs identical, over the reference's requests
    mean_first_divergence: float  # index of the first differing token (the full length when identical)
    requests: int


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def greedy_agreement(ref: Sequence[GenerationOut], cand: Sequence[GenerationOut | None] | None) -> Agreement:
    """cand is aligned with ref; a missing (None) reply counts as an empty output."""
    cand = list(cand or [])
    exact, firsts = 0, []
    for i, r in enumerate(ref):
        c = cand[i].token_ids if i < len(cand) and cand[i] is not None else []
        exact += c == r.token_ids
        firsts.append(first_divergence(r.token_ids, c))
    n = len(ref)
    return Agreement(exact / n if n else 1.0, sum(firsts) / n if n else 0.0, n)


def length_ratio(ref: Sequence[GenerationOut], cand: Sequence[GenerationOut | None] | None,
                 natural: Sequence[bool]) -> float:
    """sum(len cand) / sum(len ref) over natural-length (EOS on) requests; 1.0 when there are none."""
    cand = list(cand or [])
    idx = [i for i, nat in enumerate(natural) if nat and i < len(ref)]
    total_r = sum(len(ref[i].token_ids) for i in idx)
    total_c = sum(len(cand[i].token_ids) for i in idx if i < len(cand) and cand[i] is not None)
    return total_c / total_r if total_r else 1.0


def answer_problems(n_expected: int, replies: Sequence | None, what: str,
                    expected_lengths: Sequence[int] | None = None) -> list[str]:
    """Every request answered: the right number of replies (and, for scores, of positions)."""
    if replies is None:
        return [f"{what}: no reply (the call failed)"]
    problems = []
    if len(replies) != n_expected:
        problems.append(f"{what}: {len(replies)} replies for {n_expected} requests")
    if expected_lengths is not None:
        for i, (s, n) in enumerate(zip(replies, expected_lengths)):
            lens = {len(s.token_logprobs), len(s.top_ids), len(s.top_logprobs)}
            if lens != {n}:
                problems.append(f"{what}[{i}]: {sorted(lens)} positions, expected {n}")
    return problems


def length_problems(outs: Sequence[GenerationOut | None] | None, max_new: Sequence[int], prompt_lens: Sequence[int],
                    max_seq_len: int) -> list[str]:
    """Sane lengths: non-empty, <= max_new_tokens, a "length" finish has exactly the allowed count."""
    problems = []
    for i, out in enumerate(outs or []):
        if i >= len(max_new):
            break
        if out is None:  # missing replies are the "answered" check's business
            continue
        n, allowed = len(out.token_ids), min(max_new[i], max_seq_len - prompt_lens[i])
        if out.finish_reason not in ("stop", "length"):
            problems.append(f"request {i}: finish_reason {out.finish_reason!r}")
        if n == 0:
            problems.append(f"request {i}: empty output")
        elif n > max_new[i]:
            problems.append(f"request {i}: {n} tokens > max_new_tokens {max_new[i]}")
        elif out.finish_reason == "length" and n != allowed:
            problems.append(f"request {i}: finish 'length' after {n} tokens, expected {allowed}")
    return problems


def eos_problems(outs: Sequence[GenerationOut | None] | None, ignore_eos: Sequence[bool], eos_ids: Sequence[int],
                 stop_ids: Sequence[Sequence[int]] | None = None) -> list[str]:
    """EOS honoured: a "stop" ends in an EOS/stop id, and no EOS appears before the end (unless ignore_eos)."""
    problems, eos = [], set(eos_ids)
    for i, out in enumerate(outs or []):
        if i >= len(ignore_eos):
            break
        if out is None:
            continue
        stops = set(stop_ids[i]) if stop_ids else set()
        enders = stops if ignore_eos[i] else stops | eos
        ids = out.token_ids
        if out.finish_reason == "stop" and (not ids or ids[-1] not in enders):
            problems.append(f"request {i}: finish 'stop' but the last token {ids[-1:]} is not an EOS/stop id")
        inner = [t for t in ids[:-1] if t in enders]
        if inner:
            problems.append(f"request {i}: EOS/stop id {inner[0]} inside the output (it should have ended there)")
    return problems


def tolerance(floor: float, factor: float, noise: float, cap: float) -> float:
    """The calibrated tolerance: at least the floor, factor x the reference's own noise, at most the cap."""
    noise = noise if math.isfinite(noise) else cap
    return min(cap, max(floor, factor * noise))


def near_argmax(scores: Sequence[ScoreOut], margin: float) -> int:
    """How many forced tokens the scorer puts within `margin` nats of its own top-1 (i.e. a greedy choice that
    differs only by a near-tie). Scores must have been asked with top_k >= 1."""
    return sum(lp >= top[0] - margin for s in scores for lp, top in zip(s.token_logprobs, s.top_logprobs) if top)


def scoreable(prompt: Sequence[int], out: GenerationOut, max_new: int, vocab: int, max_seq_len: int) -> bool:
    """Whether a candidate's output can be handed to the reference for scoring (else it would raise)."""
    ids = out.token_ids
    return bool(ids) and len(ids) <= max_new and len(prompt) + len(ids) <= max_seq_len \
        and all(0 <= t < vocab for t in ids)
