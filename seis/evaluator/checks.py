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
import random
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
    """sum(len cand) / sum(len ref) over natural-length (EOS on) requests whose outputs agree up to the shorter
    one's end; 1.0 when there are none. Only there is a length difference a stopping fault (a missed stop, or a
    cut without one): once two greedy outputs diverge by rounding, each is a different text with its own length,
    and its tokens, the stop included, are judged one by one against the reference (greedy_valid, stops)."""
    cand = list(cand or [])
    total_r = total_c = 0
    for i, nat in enumerate(natural):
        if not nat or i >= len(ref) or i >= len(cand) or cand[i] is None:
            continue
        r, c = ref[i].token_ids, cand[i].token_ids
        n = min(len(r), len(c))
        if list(r[:n]) == list(c[:n]):
            total_r += len(r)
            total_c += len(c)
    return total_c / total_r if total_r else 1.0


@dataclass(frozen=True)
class EarlyEnds:
    """Natural-length requests on which the candidate ended before / after the reference, and the one-sided
    sign-test p-value of at least that many early ends were either direction equally likely."""
    shorter: int
    longer: int
    p: float


def early_ends(ref: Sequence[GenerationOut | None], cand: Sequence[GenerationOut | None],
               natural: Sequence[bool]) -> EarlyEnds:
    """Which way the lengths differ, over natural-length requests both engines answered (each a distinct prompt).

    Honest rounding breaks near-ties both ways: at an EOS near-tie the candidate stops early as often as it runs
    on, and texts parted at an ordinary near-tie end wherever they end. Each stop alone is judged by the stop
    margin, which an engine taking EOS at every near-tie it meets would pass while still cutting outputs short;
    what gives it away is the direction."""
    shorter = longer = 0
    for r, c, nat in zip(ref, cand, natural):
        if nat and r is not None and c is not None:
            shorter += len(c.token_ids) < len(r.token_ids)
            longer += len(c.token_ids) > len(r.token_ids)
    n = shorter + longer
    return EarlyEnds(shorter, longer, sum(math.comb(n, k) for k in range(shorter, n + 1)) / 2 ** n)


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
                    max_seq_len: int, exact: Sequence[bool] | None = None) -> list[str]:
    """Sane lengths: non-empty, <= max_new_tokens, a "length" finish has exactly the allowed count. Where
    exact[i] (ignore_eos and no stop ids: nothing may end the request early) the output must have exactly the
    allowed count (max_new_tokens, or what the context leaves) and finish "length"."""
    problems = []
    for i, out in enumerate(outs or []):
        if i >= len(max_new):
            break
        if out is None:  # missing replies are the "answered" check's business
            continue
        n, allowed = len(out.token_ids), min(max_new[i], max_seq_len - prompt_lens[i])
        if out.finish_reason not in ("stop", "length"):
            problems.append(f"request {i}: finish_reason {_finish(out)}")
        if n == 0:
            problems.append(f"request {i}: empty output")
        elif n > max_new[i]:
            problems.append(f"request {i}: {n} tokens > max_new_tokens {max_new[i]}")
        elif out.finish_reason == "length" and n != allowed:
            problems.append(f"request {i}: finish 'length' after {n} tokens, expected {allowed}")
        elif exact is not None and i < len(exact) and exact[i] and (n != allowed or out.finish_reason != "length"):
            problems.append(f"request {i}: ignore_eos without stop ids gave {n} tokens with finish "
                            f"{_finish(out)}, expected exactly {allowed} with finish 'length'")
    return problems


def _finish(out: GenerationOut) -> str:
    """A finish reason as a problem line quotes it: the contract's two by name, any other string not at all (the
    engine chose it after seeing held-out prompts, and agents read these lines)."""
    return repr(out.finish_reason) if out.finish_reason in ("stop", "length") else "other than 'stop' or 'length'"


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
            problems.append(f"request {i}: finish 'stop' but the last token is not an EOS/stop id")
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


# --- sampling semantics -------------------------------------------------------------------------------------------
# The reference's top-64 log-probs after a prompt define the exact target of a request with top_k < 64: the
# tokens beyond the top-k get no mass whatever their log-probs. Mirrors E0: temperature, then the top-k cut (ties
# with the k-th kept), softmax over what is left, then the nucleus (the smallest prefix by probability whose mass
# reaches top_p; the first token always stays), renormalised.
def _sorted_pairs(ids: Sequence[int], lps: Sequence[float]) -> list[tuple[int, float]]:
    return sorted(zip(ids, lps), key=lambda x: -x[1])


def _tempered(pairs: list[tuple[int, float]], temperature: float, top_k: int) -> list[tuple[int, float]]:
    """(id, probability) over the top-k (ties with the k-th kept), sorted by probability, summing to 1."""
    if top_k > 0 and len(pairs) > top_k:
        kth = pairs[top_k - 1][1]
        pairs = [p for p in pairs if p[1] >= kth]
    top = pairs[0][1]
    w = [math.exp((lp - top) / temperature) for _, lp in pairs]
    z = sum(w)
    return [(t, x / z) for (t, _), x in zip(pairs, w)]


def target_distribution(ids: Sequence[int], lps: Sequence[float], temperature: float, top_k: int,
                        top_p: float) -> dict[int, float]:
    """The exact sampling distribution (token -> probability) of (temperature, top_k, top_p) given the
    reference's top log-probs; top_k must be below the number of log-probs given."""
    if not ids or temperature <= 0:
        raise ValueError("need log-probs and a positive temperature")
    probs = _tempered(_sorted_pairs(ids, lps), temperature, top_k)
    kept, cum = [], 0.0
    for t, p in probs:
        if kept and cum >= top_p:
            break
        kept.append((t, p))
        cum += p
    z = sum(p for _, p in kept)
    return {t: p / z for t, p in kept}


def top_probability(lps: Sequence[float], temperature: float, top_k: int) -> float:
    pairs = _sorted_pairs(range(len(lps)), lps)
    return _tempered(pairs, temperature, top_k)[0][1]


def temperature_for(lps: Sequence[float], top_k: int, target: float, lo: float = 1e-3, hi: float = 1e3,
                    iterations: int = 60) -> float:
    """The temperature at which the top-k distribution's top probability is `target` (bisection in log T; the top
    probability falls as T rises). Clamped to [lo, hi] where the target cannot be reached."""
    if top_probability(lps, hi, top_k) >= target:
        return hi
    if top_probability(lps, lo, top_k) <= target:
        return lo
    a, b = math.log(lo), math.log(hi)
    for _ in range(iterations):
        mid = (a + b) / 2
        if top_probability(lps, math.exp(mid), top_k) > target:
            a = mid
        else:
            b = mid
    return math.exp((a + b) / 2)


def well_conditioned_top_p(lps: Sequence[float], temperature: float, top_k: int, nominal: float,
                           min_gap: float = 0.25) -> float:
    """A top_p near `nominal` whose nucleus boundary is robust: the midpoint of the cumulative-mass interval that
    gives the nucleus its size, for the size whose last kept and first dropped tokens differ by >= min_gap nats
    (else the best-separated one). A nominal top_p that falls on (or near) a cumulative mass, e.g. 0.6 when the
    top two tokens are tied at 0.3 each, would make the nucleus depend on float rounding and on which of two
    tied tokens a sort puts first; seen on GPU bf16, where E0's own samples then missed the target by TV 0.25."""
    pairs = _sorted_pairs(range(len(lps)), lps)
    probs = _tempered(pairs, temperature, top_k)
    lp_of = dict(pairs)
    best, best_key = nominal, None
    cum = probs[0][1]
    for m in range(2, len(probs)):  # a nucleus of m >= 2 tokens (one token would be greedy)
        p_last = probs[m - 1][1]
        mid = cum + p_last / 2      # size m iff (mass of the first m-1) < top_p <= (mass of the first m)
        cum += p_last
        gap = lp_of[probs[m - 1][0]] - lp_of[probs[m][0]]
        key = (gap < min_gap, abs(mid - nominal) if gap >= min_gap else -gap)
        if best_key is None or key < best_key:
            best, best_key = mid, key
    return best


def _binomial_mean_abs_dev(n: int, q: float) -> float:
    """E|X - n q| for X ~ Binomial(n, q), exactly."""
    if q <= 0.0 or q >= 1.0:
        return 0.0
    lq, l1q, lgn = math.log(q), math.log1p(-q), math.lgamma(n + 1)
    return sum(math.exp(lgn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * l1q) * abs(k - n * q)
               for k in range(n + 1))


def expected_tv(q: Sequence[float], n: int) -> float:
    """The expected total-variation distance between q and the empirical distribution of n exact samples of q:
    pure sampling noise, the floor of any sampling check at that n."""
    return 0.5 * sum(_binomial_mean_abs_dev(n, p) for p in q) / n if n else math.nan


def empirical_tv(samples: Sequence[int | None], q: dict[int, float]) -> float:
    """TV between q and the samples' empirical distribution; a missing sample (None) is mass outside q."""
    n = len(samples)
    if n == 0:
        return math.nan
    counts: dict[int | None, int] = {}
    for t in samples:
        counts[t] = counts.get(t, 0) + 1
    keys = set(q) | set(counts)
    return 0.5 * sum(abs(counts.get(t, 0) / n - (q.get(t, 0.0) if t is not None else 0.0)) for t in keys)


def greedy_tv(q: dict[int, float]) -> float:
    """The TV an engine that always picks the top token would score: 1 - q(top)."""
    return 1.0 - max(q.values())


def tolerated_tokens(ids: Sequence[int], lps: Sequence[float], temperature: float, top_k: int, top_p: float,
                     sigma: float, draws: int = 256, seed: int = 0) -> set[int]:
    """The allowed set, widened by logit noise: the union of the allowed sets of `draws` copies of the log-probs,
    each perturbed by independent N(0, sigma^2) noise (what a legitimately different kernel does to bf16 logits).
    Near-ties at the top-k cut and nucleus boundaries that such noise can move are covered; tokens far from
    the cut are not. Deterministic (seeded)."""
    allowed = set(target_distribution(ids, lps, temperature, top_k, top_p))
    if sigma > 0:
        rng = random.Random(seed)
        for _ in range(draws):
            allowed |= set(target_distribution(ids, [lp + rng.gauss(0.0, sigma) for lp in lps], temperature,
                                               top_k, top_p))
    return allowed


def support_problems(samples: Sequence[int | None], ids: Sequence[int], lps: Sequence[float], temperature: float,
                     top_k: int, top_p: float, sigma: float, label: str) -> tuple[list[str], int]:
    """Sampled tokens outside the allowed (top-k, then top-p) set, grouped by token; and how many samples those
    are. A token outside is tolerated when logit noise of scale `sigma` nats could have put it inside
    (tolerated_tokens); a token beyond the given log-probs only when the lowest given one is within 3 sigma of
    the lowest allowed one (then it cannot be judged)."""
    allowed = target_distribution(ids, lps, temperature, top_k, top_p)
    lp_of = dict(zip(ids, lps))
    cut = min(lp_of[t] for t in allowed)
    counts: dict[int | None, int] = {}
    for t in samples:
        if t is None or t not in allowed:
            counts[t] = counts.get(t, 0) + 1
    ok = tolerated_tokens(ids, lps, temperature, top_k, top_p, sigma) if counts else set()
    problems, outside = [], 0
    for t, c in sorted(counts.items(), key=lambda x: (-x[1], str(x[0]))):
        if t is None:
            problems.append(f"{label}: {c} requests gave no token")
            outside += c
        elif t not in ok and not (t not in lp_of and min(lps) >= cut - 3 * sigma):
            lp = f"log-prob {lp_of[t]:.3f}" if t in lp_of else f"not in the reference's top {len(lps)}"
            problems.append(f"{label}: token {t} sampled {c}x, outside the {len(allowed)} allowed tokens "
                            f"({lp}; lowest allowed {cut:.3f})")
            outside += c
    return problems, outside


@dataclass(frozen=True)
class SequenceFit:
    """How likely a run of sampled tokens is under its exact targets, against what exact sampling gives.

    At each sampled position the target q is known (the reference teacher-forced on the sampled prefix), and for a
    token x drawn from q, log q(x) + H(q) has mean 0 and variance Var_q(log q). Their mean over positions,
    `deviation`, is then ~0 within `stderr`: an engine that decodes greedily after the first token scores well
    above 0 (its tokens are likelier than samples), one that samples from a lossy model well below."""

    tokens: int           # positions judged (sampled token inside its target's support)
    deviation: float      # mean of log q(x) + H(q), nats per token
    stderr: float         # its standard deviation under exact sampling


def sequence_fit(targets: Sequence[dict[int, float]], tokens: Sequence[int]) -> SequenceFit:
    """Positions whose token lies outside its target are left out (the support check names them)."""
    total = var = 0.0
    n = 0
    for q, x in zip(targets, tokens):
        if x not in q:
            continue
        logs = {t: math.log(p) for t, p in q.items() if p > 0}
        entropy = -sum(q[t] * lp for t, lp in logs.items())
        total += logs[x] + entropy if x in logs else 0.0
        var += sum(q[t] * lp * lp for t, lp in logs.items()) - entropy * entropy
        n += 1
    if n == 0:
        return SequenceFit(0, math.nan, math.nan)
    return SequenceFit(n, total / n, math.sqrt(max(var, 0.0)) / n)


def small_sample_slack(rate: float, n: int) -> float:
    """Two binomial standard deviations of a disagreement rate measured on n positions: what a split with few
    positions adds to a per-position tolerance, so chance alone does not fail it."""
    return 2.0 * math.sqrt(max(rate, 0.0) * max(1.0 - rate, 0.0) / n) if n > 0 else 0.0


# --- stop_token_ids -----------------------------------------------------------------------------------------------
def stop_position(out: Sequence[int], eos_ids: Sequence[int], lo: int = 2, hi: int = 8) -> int | None:
    """The first j in [lo, hi] whose token appears there for the first time, is no EOS, and is not the output's
    last token (so an engine ignoring the stop id visibly runs past it); None when there is none."""
    eos = set(eos_ids)
    for j in range(lo, min(hi, len(out) - 2) + 1):
        if out[j] not in out[:j] and out[j] not in eos:
            return j
    return None


LATE_STOP_FROM = (16, 64)  # a late stop request at the first new token from each of these positions on, and the last


def late_stop_positions(out: Sequence[int], eos_ids: Sequence[int],
                        starts: Sequence[int] = LATE_STOP_FROM) -> list[int]:
    """Stop positions late in one long output, for engines that honour stop ids only early (in a first decode
    chunk, below some output length): for each start, the first j >= start whose token appears there for the
    first time, is no EOS and is not the output's last token; and the last such j of the output. Sorted, without
    repeats; empty when the output has none past min(starts)."""
    eos, seen, found = set(eos_ids), set(), []
    for j, t in enumerate(out[:-1]):
        if t not in seen and t not in eos and j >= min(starts, default=0):
            found.append(j)
        seen.add(t)
    picks = {next((j for j in found if j >= s), None) for s in starts} | ({found[-1]} if found else set())
    return sorted(j for j in picks if j is not None)


def stop_problems(outs: Sequence[GenerationOut | None] | None, expected: Sequence[Sequence[int]],
                  stop_ids: Sequence[Sequence[int]], ignore_eos: Sequence[bool], eos_ids: Sequence[int],
                  max_new: Sequence[int]) -> list[str]:
    """stop_token_ids honoured. expected[i]: the reference's greedy tokens through the first stop id (the output
    a request must give when it follows the reference that far). Violations: a stop id (or, unless ignore_eos, an
    EOS) inside the output before its end; an output that equals the expected tokens through the stop id but
    does not end there; an output ending in a stop id whose finish is not "stop", or a "stop" that does not end
    in one; more than max_new_tokens."""
    problems, eos = [], set(eos_ids)
    for i, out in enumerate(outs or []):
        if i >= len(expected) or out is None:
            continue
        ids, exp = out.token_ids, list(expected[i])
        enders = set(stop_ids[i]) | (set() if ignore_eos[i] else eos)
        inner = next((k for k, t in enumerate(ids[:-1]) if t in enders), None)
        if ids[: len(exp)] == exp and len(ids) != len(exp):
            problems.append(f"request {i}: followed the reference through stop id {exp[-1]} at token "
                            f"{len(exp) - 1} but did not end there ({len(ids)} tokens)")
        elif inner is not None:
            problems.append(f"request {i}: stop id {ids[inner]} at token {inner}, but the output goes on to "
                            f"{len(ids)} tokens")
        if ids and ids[-1] in enders and out.finish_reason != "stop":
            problems.append(f"request {i}: ends in stop id {ids[-1]} with finish {_finish(out)}")
        elif out.finish_reason == "stop" and (not ids or ids[-1] not in enders):
            problems.append(f"request {i}: finish 'stop' but the last token is no stop id")
        if len(ids) > max_new[i] or not ids:
            problems.append(f"request {i}: {len(ids)} tokens (max_new_tokens {max_new[i]})")
    return problems
