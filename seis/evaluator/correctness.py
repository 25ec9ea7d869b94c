"""Correctness: the candidate against the reference on the same prompts, in the same batch compositions.

Order of work: the reference runs everything first (its outputs define the forced continuations, the EOS
probes and the stop-id requests; its next-token log-probs define the sampling targets; its second,
differently-batched run calibrates the thresholds); then the candidate runs the same calls; then pure functions
(checks.py) turn the two into named checks.

Splits: dev and heldout (GSM8K and token-id shapes) as always; long_context (prompts of ~1.5k tokens, or what
the model's context allows) and late (one dev prompt generated and teacher-forced for late_tokens tokens, so
decode positions past 256 are checked), each checked like the others but for the exact-output rate, which a
handful of requests cannot measure (greedy_valid judges their greedy tokens), and with tolerances calibrated on
their own requests. Beyond the splits: sampling semantics (sampling.support, sampling.tv on one-token requests;
sampling.sequence_support, sampling.sequence on multi-token ones, whose later tokens come from decode steps;
sampling.seeded: the same seeded requests in another batch order give the same tokens) and stop_token_ids
(stop_ids: stops at output positions 2..8, and, from the late split's output, past 16, past 64 and near its end).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..engine_host.client import Sampling
from .calibration import calibrate, greedy_noise, noise_from_runs, split_noise
from .checks import (
    answer_problems,
    empirical_tv,
    eos_problems,
    expected_tv,
    first_divergence,
    forced_stats,
    greedy_agreement,
    greedy_tv,
    late_stop_positions,
    length_problems,
    length_ratio,
    near_argmax,
    scoreable,
    sequence_fit,
    small_sample_slack,
    stop_position,
    stop_problems,
    support_problems,
    target_distribution,
    temperature_for,
    well_conditioned_top_p,
)
from .engines import EngineHandle, GenerationOut, ScoreOut
from .errors import ReferenceFailure
from .gate_config import CheckSizes, GateConfig, GateThresholds
from .schema import Calibration, CheckResult
from .workloads import GateWorkloads, PromptSet

PATHS = ("decode", "verify")   # score(): one decode step per token; verify(): M rows in one forward step
SCAN_IDS = 512                 # single-token prompts scanned for EOS probes when no output contained an EOS
CHAT_PROBE_TAIL = 2            # answer tokens a chat probe leaves the engine to generate before its EOS (at most)
CHAT_PROBE_MARGIN = 1.0        # nats each of those tokens, and the EOS, lead the reference's runner-up by
CHAT_PROBE_TOP = 4             # log-probs asked per position (two EOS ids may come first)
SAMPLING_TOP = 64              # log-probs asked of the reference per sampling prompt (> sampling_top_k)
STOP_SLACK = 4                 # tokens a stop-id request may run past the stop position (ignoring it shows)
STOP_UNUSED = 15               # unused stop ids before the real one in some stop-id requests (16 ids in all)


@dataclass(frozen=True)
class Mixed:
    """Held-out requests interleaved with the dev requests in reverse order: the dev prompts get other batch
    positions, other neighbours and other lengths, but the engine is never told which is which."""

    prompts: PromptSet
    heldout_at: list[int]
    dev_at: list[int]


def mix(dev: PromptSet, heldout: PromptSet) -> Mixed:
    order: list[tuple[str, int]] = []
    devs, helds = list(reversed(range(len(dev)))), list(range(len(heldout)))
    while devs or helds:
        if helds:
            order.append(("heldout", helds.pop(0)))
        if devs:
            order.append(("dev", devs.pop(0)))
    src = {"dev": dev, "heldout": heldout}
    prompts = PromptSet("mixed", tuple(src[k].labels[i] for k, i in order), tuple(src[k].prompts[i] for k, i in order),
                        tuple(src[k].sampling[i] for k, i in order))
    at = {"dev": [0] * len(dev), "heldout": [0] * len(heldout)}
    for pos, (kind, i) in enumerate(order):
        at[kind][i] = pos
    return Mixed(prompts, at["heldout"], at["dev"])


def _pick(outs: list | None, positions: list[int]) -> list:
    outs = outs or []
    return [outs[p] if p < len(outs) else None for p in positions]


@dataclass
class Runs:
    """One engine's replies to the check workload (None where a call failed)."""

    gen: dict[str, list | None] = field(default_factory=dict)          # split -> aligned generations
    gen_problems: dict[str, list[str]] = field(default_factory=dict)   # split -> "answered" problems
    scores: dict[tuple[str, str], list[ScoreOut] | None] = field(default_factory=dict)  # (split, path)
    probes: list[GenerationOut] | None = None
    sampling: list[GenerationOut] | None = None
    sequences: list[GenerationOut] | None = None
    sequences_reversed: list[GenerationOut | None] | None = None  # the same requests asked in reverse order
    stop: list[GenerationOut] | None = None
    own_stop: StopPlan | None = None       # stops late in this engine's own late output (candidates only)
    own_stop_out: list[GenerationOut | None] | None = None


def _run_generations(engine: EngineHandle, wl: GateWorkloads, mixed: Mixed) -> tuple[Runs, list | None]:
    runs = Runs()
    dev = engine.generate(wl.dev.prompt_lists(), list(wl.dev.sampling))
    runs.gen["dev"] = _pick(dev, list(range(len(wl.dev))))
    runs.gen_problems["dev"] = answer_problems(len(wl.dev), dev, "generate (dev batch)")
    mixed_out = engine.generate(mixed.prompts.prompt_lists(), list(mixed.prompts.sampling))
    runs.gen["heldout"] = _pick(mixed_out, mixed.heldout_at)
    runs.gen_problems["heldout"] = answer_problems(len(mixed.prompts), mixed_out, "generate (held-out batch)")
    return runs, mixed_out


def _run_extra(engine: EngineHandle, runs: Runs, extra: dict[str, PromptSet]) -> None:
    """The long-context and late-position requests, in one batch of their own."""
    if not extra:
        return
    batch = [(split, i) for split, ps in extra.items() for i in range(len(ps))]
    outs = engine.generate([list(extra[s].prompts[i]) for s, i in batch], [extra[s].sampling[i] for s, i in batch])
    for split, ps in extra.items():
        runs.gen[split] = _pick(outs, [k for k, (s, _) in enumerate(batch) if s == split])
        runs.gen_problems[split] = answer_problems(len(batch), outs, f"generate ({' + '.join(extra)} batch)")


def _run_scores(engine: EngineHandle, runs: Runs, sets: dict[str, PromptSet], forced: dict[str, list[list[int]]],
                top_k: int) -> None:
    for split, ps in sets.items():
        for path in PATHS:
            fn = engine.score if path == "decode" else engine.verify
            runs.scores[(split, path)] = fn(ps.prompt_lists(), forced[split], top_k)


def _mine_probes(ref: EngineHandle, sets: dict[str, PromptSet], runs: Runs, eos: set[int], n: int,
                 vocab: int, chat: PromptSet | None = None, new_tokens: int = 2) -> list[list[int]]:
    """Prompts after which the reference's greedy continuation reaches an EOS within `new_tokens`, from three
    sources in turn until there are n: every prompt + output prefix that the reference ended (or, with ignore_eos,
    continued past) an EOS at; the chat probe questions a real instruct model answers in a few tokens
    (_chat_probes; none without a chat template); single-token prompts whose next token is an EOS (random
    weights)."""
    if n == 0:
        return []
    probes: list[list[int]] = []
    for split, ps in sets.items():
        for prompt, out in zip(ps.prompts, runs.gen[split]):
            cut = next((t for t, tok in enumerate(out.token_ids) if tok in eos), None)
            probe = list(prompt) + out.token_ids[:cut] if cut is not None else None
            if probe and probe not in probes:
                probes.append(probe)
    if len(probes) < n and chat is not None and len(chat):
        probes += [p for p in _chat_probes(ref, chat, eos, new_tokens) if p not in probes]
    if len(probes) < n:
        scan = [[t] for t in range(min(vocab, SCAN_IDS)) if t not in eos]
        outs = ref.generate(scan, [Sampling(max_new_tokens=1, ignore_eos=True)] * len(scan))
        probes += [p for p, o in zip(scan, outs) if o.token_ids and o.token_ids[0] in eos]
    return probes[:n]


def _chat_probes(ref: EngineHandle, chat: PromptSet, eos: set[int], new_tokens: int) -> list[list[int]]:
    """The chat source: the reference answers the chat-formatted probe questions greedily (EOS on); each answer
    that ends in an EOS gives question + answer minus its last k tokens (k <= CHAT_PROBE_TAIL, < new_tokens), so an
    engine generates those k tokens and must then stop at the EOS. Only sure endings count: teacher-forced through
    the reference, the EOS and each of the k tokens must lead the runner-up by CHAT_PROBE_MARGIN nats (k shrinks to
    the sure ones; a probe whose EOS itself is a near-tie is dropped), so bf16 noise cannot fail an honest engine."""
    outs = ref.generate(chat.prompt_lists(), list(chat.sampling))
    ended = [(list(prompt), out.token_ids) for prompt, out in zip(chat.prompts, outs)
             if out.finish_reason == "stop" and out.token_ids and out.token_ids[-1] in eos
             and not any(t in eos for t in out.token_ids[:-1])]
    if not ended:
        return []
    tails = [min(CHAT_PROBE_TAIL, new_tokens - 1, len(ids) - 1) for _, ids in ended]
    scores = ref.score([p + ids[: len(ids) - 1 - t] for (p, ids), t in zip(ended, tails)],
                       [ids[len(ids) - 1 - t:] for (_, ids), t in zip(ended, tails)], top_k=CHAT_PROBE_TOP)
    probes = []
    for (prompt, ids), t, sc in zip(ended, tails, scores):
        lead = [_lead(tok, top_ids, top_lps, eos) for tok, top_ids, top_lps
                in zip(ids[len(ids) - 1 - t:], sc.top_ids, sc.top_logprobs)]
        if len(lead) != t + 1 or lead[-1] < CHAT_PROBE_MARGIN:
            continue
        k = 0
        while k < t and lead[t - 1 - k] >= CHAT_PROBE_MARGIN:
            k += 1
        probes.append(prompt + ids[: len(ids) - 1 - k])
    return probes


def _lead(token: int, top_ids: list[int], top_lps: list[float], eos: set[int]) -> float:
    """How far (nats) the reference puts `token` ahead of its runner-up (-inf: not its top-1). Every EOS id counts
    as `token` when it is an EOS (any of them stops); a runner-up below the top-k list is bounded by its last."""
    same = (lambda t: t in eos) if token in eos else (lambda t: t == token)
    if not top_ids or not same(top_ids[0]):
        return -math.inf
    best = top_lps[0]
    others = [lp for t, lp in zip(top_ids, top_lps) if not same(t)]
    return best - (others[0] if others else top_lps[-1])


def _alone(engine: EngineHandle, ps: PromptSet, forced: list[list[int]] | None = None, path: str | None = None,
           top_k: int = 0) -> list:
    """The same requests one at a time (the reference's other batch composition)."""
    out = []
    for i, prompt in enumerate(ps.prompt_lists()):
        if path is None:
            out += engine.generate([prompt], [ps.sampling[i]])
        else:
            fn = engine.score if path == "decode" else engine.verify
            out += fn([prompt], [forced[i]], top_k)
    return out


# --- sampling semantics --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingGroup:
    """n seeded one-token requests of one prompt under one (temperature, top_k, top_p), and their exact target."""

    label: str
    prompt: tuple[int, ...]
    ids: list[int]
    lps: list[float]
    temperature: float
    top_k: int
    top_p: float
    q: dict[int, float]
    seeds: list[int]


def _sampling_plan(ref: EngineHandle, dev: PromptSet, sizes: CheckSizes, nonce: str,
                   vocab: int) -> list[SamplingGroup]:
    prompts = [list(p) for p in dev.prompts[: sizes.n_sampling_prompts]]
    if not prompts or vocab <= SAMPLING_TOP:
        return []
    scores = ref.score(prompts, [[0]] * len(prompts), top_k=SAMPLING_TOP)
    groups = []
    for i, (prompt, sc) in enumerate(zip(prompts, scores)):
        ids, lps = sc.top_ids[0], sc.top_logprobs[0]
        temp = temperature_for(lps, sizes.sampling_top_k, sizes.sampling_target_top)
        nucleus = well_conditioned_top_p(lps, temp, sizes.sampling_top_k, sizes.sampling_top_p)
        for top_p in (1.0, nucleus):
            g = len(groups)
            q = target_distribution(ids, lps, temp, sizes.sampling_top_k, top_p)
            groups.append(SamplingGroup(
                f"{dev.labels[i]} T={temp:.3g} top_k={sizes.sampling_top_k} top_p={top_p:g}", tuple(prompt), ids,
                lps, temp, sizes.sampling_top_k, top_p, q,
                [_seed(nonce, g, k) for k in range(sizes.n_samples)]))
    return groups


def _seed(nonce: str, group: int, k: int) -> int:
    """A sampled request's seed, from the gate's prompt nonce: seeds that were the same in every gate (1, 2, ...
    at the default config seed) let an engine sample properly for them alone."""
    return int(hashlib.sha256(f"{nonce}:seed:{group}:{k}".encode()).hexdigest()[:8], 16)


def _sequence_requests(groups: list[SamplingGroup], sizes: CheckSizes, nonce: str
                       ) -> tuple[list[list[int]], list[Sampling], list[int]]:
    """n_sequences multi-token requests per sampling group (its prompt and setting), and each one's group: every
    token after the first comes from a decode step, which one-token requests never reach. Every other request names
    no seed: were every sampled request of the gate seeded, an engine could sample properly only when a seed is given
    and decode the unseeded requests most users send greedily (sampling.sequence judges both kinds alike;
    sampling.seeded only the seeded ones)."""
    new = min(sizes.sequence_tokens, sizes.max_new_tokens)  # max_new_tokens: what the context leaves every prompt
    prompts, sampling, owner = [], [], []
    for i, g in enumerate(groups):
        for k in range(sizes.n_sequences):
            prompts.append(list(g.prompt))
            seed = _seed(nonce, i, sizes.n_samples + k) if k % 2 == 0 else None
            sampling.append(Sampling(max_new_tokens=new, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                                     seed=seed, ignore_eos=True))
            owner.append(i)
    return prompts, sampling, owner


def _scored_sequences(ref: EngineHandle, rp: "_ReferencePass", outs: list | None, vocab: int, max_seq_len: int
                      ) -> tuple[list[tuple[SamplingGroup, list[int], ScoreOut]], list[str]]:
    """(group, sampled tokens, the reference's top log-probs teacher-forced on them) per scoreable reply, and the
    problems of the replies (missing, wrong length, unscoreable)."""
    n = len(rp.sequence_prompts)
    problems = answer_problems(n, outs, "generate (sampled sequences)")
    if outs is None:
        return [], problems
    outs = _pick(outs, list(range(n)))
    max_new = [sp.max_new_tokens for sp in rp.sequence_params]
    problems += ["sampled sequence " + p for p in length_problems(
        outs, max_new, [len(p) for p in rp.sequence_prompts], max_seq_len, exact=[True] * n)]
    keep = [i for i, o in enumerate(outs)
            if o is not None and scoreable(rp.sequence_prompts[i], o, max_new[i], vocab, max_seq_len)]
    scores = ref.score([rp.sequence_prompts[i] for i in keep], [outs[i].token_ids for i in keep],
                       top_k=SAMPLING_TOP) if keep else []
    return [(rp.groups[rp.sequence_groups[i]], outs[i].token_ids, sc) for i, sc in zip(keep, scores or [])], problems


def _fit(scored: list[tuple[SamplingGroup, list[int], ScoreOut]]):
    """checks.sequence_fit over every sampled position, each against its exact target."""
    targets, tokens = [], []
    for g, ids, sc in scored:
        for x, top_ids, top_lps in zip(ids, sc.top_ids, sc.top_logprobs):
            targets.append(target_distribution(top_ids, top_lps, g.temperature, g.top_k, g.top_p))
            tokens.append(x)
    return sequence_fit(targets, tokens)


def _sequence_checks(ref: EngineHandle, rp: "_ReferencePass", outs: list | None, cal: Calibration, z: float,
                     vocab: int, max_seq_len: int) -> list[CheckResult]:
    """sampling.sequence_support: every sampled token inside its position's allowed set (up to logit noise, as
    sampling.support); sampling.sequence: their fit to the exact targets, within z standard errors plus the
    calibrated shift (checks.sequence_fit)."""
    scored, problems = _scored_sequences(ref, rp, outs, vocab, max_seq_len)
    sigma = cal.tolerance["sampling_margin"]
    for k, (g, ids, sc) in enumerate(scored):
        for i, (x, top_ids, top_lps) in enumerate(zip(ids, sc.top_ids, sc.top_logprobs)):
            problems += support_problems([x], top_ids, top_lps, g.temperature, g.top_k, g.top_p, sigma,
                                         f"{g.label} sequence {k} token {i}")[0]
    fit = _fit(scored)
    tol = z * fit.stderr + cal.tolerance["sampling_sequence"]  # nan (the check fails) when nothing was scored
    n_req = len(rp.sequence_prompts)
    return [
        CheckResult.rules("sampling.sequence_support", problems, n_req),
        CheckResult.bounded(
            "sampling.sequence", fit.deviation, lower=-tol, upper=tol,
            detail=f"mean log q(x) + H(q) over {fit.tokens} sampled tokens of {n_req} multi-token requests (every "
                   f"other one unseeded), q the exact target at each position (0 for exact sampling, standard error {fit.stderr:.3f}; "
                   f"above: likelier than samples, as greedy; below: from another distribution); tolerance "
                   f"{z:g} standard errors + {cal.tolerance['sampling_sequence']:.3f} (reference's own "
                   f"{cal.noise['sampling_sequence_deviation']:.3f})",
            extra={"tokens": float(fit.tokens), "stderr": fit.stderr,
                   "reference_deviation": cal.noise["sampling_sequence_deviation"]}),
    ]


def _reversed_sequences(engine: EngineHandle, rp: "_ReferencePass") -> list[GenerationOut | None] | None:
    """The sampled sequence requests again in reverse order (each at another batch position, beside other
    requests), the replies put back in the plan's order."""
    n = len(rp.sequence_prompts)
    outs = engine.generate(rp.sequence_prompts[::-1], rp.sequence_params[::-1])
    return None if outs is None else _pick(outs, list(range(n)))[::-1]


def _seeded(params: list[Sampling]) -> list[int]:
    """The sequence requests that name a seed (the unseeded ones need not repeat their tokens)."""
    return [i for i, sp in enumerate(params) if sp.seed is not None]


def _seeded_agreement(first: list | None, again: list | None, seeded: list[int]) -> float:
    """The share of the seeded requests whose two replies (plan order, reverse order) have the same tokens."""
    pairs = zip(_pick(first, seeded), _pick(again, seeded))
    n = len(seeded)
    return sum(a is not None and b is not None and a.token_ids == b.token_ids for a, b in pairs) / n if n else 1.0


def _seeded_check(rp: "_ReferencePass", c: Runs, cal: Calibration) -> CheckResult:
    seeded = _seeded(rp.sequence_params)
    n = len(seeded)
    rate = _seeded_agreement(c.sequences, c.sequences_reversed, seeded)
    return CheckResult.bounded(
        "sampling.seeded", rate, lower=1 - cal.tolerance["sampling_seeded"],
        detail=f"{round(rate * n)} of {n} seeded sampled requests gave the same tokens in the batch and in the "
               f"same batch reversed (reference: {1 - cal.noise['sampling_seeded_mismatch']:.3f})")


def _sampling_requests(groups: list[SamplingGroup]) -> tuple[list[list[int]], list[Sampling]]:
    prompts, sampling = [], []
    for g in groups:
        for s in g.seeds:
            prompts.append(list(g.prompt))
            sampling.append(Sampling(max_new_tokens=1, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                                     seed=s, ignore_eos=True))
    return prompts, sampling


def _samples(groups: list[SamplingGroup], outs: list | None) -> list[list[int | None]] | None:
    """Each group's sampled tokens (None: no token in that reply); None when the call failed."""
    if outs is None:
        return None
    flat = [o.token_ids[0] if o is not None and o.token_ids else None for o in _pick(outs, list(range(
        sum(len(g.seeds) for g in groups))))]
    out, k = [], 0
    for g in groups:
        out.append(flat[k : k + len(g.seeds)])
        k += len(g.seeds)
    return out


def _mean_tv(groups: list[SamplingGroup], samples: list[list[int | None]] | None) -> float | None:
    if samples is None:
        return None
    return sum(empirical_tv(s, g.q) for g, s in zip(groups, samples)) / len(groups)


def _sampling_noise(groups: list[SamplingGroup], ref_outs: list, alone: list[ScoreOut]) -> dict[str, float]:
    """The reference's own TV, the analytic expected TV, and its log-prob noise (batched vs one at a time) with
    the target shift that noise causes."""
    n = len(groups[0].seeds)
    lp_noise, shifts = 0.0, []
    by_prompt: dict[tuple[int, ...], int] = {}
    for g in groups:
        by_prompt.setdefault(g.prompt, len(by_prompt))
    for g in groups:
        sc = alone[by_prompt[g.prompt]]
        ids_a, lps_a = sc.top_ids[0], sc.top_logprobs[0]
        other = dict(zip(ids_a, lps_a))
        top = sorted(zip(g.ids, g.lps), key=lambda x: -x[1])[: g.top_k]
        lp_noise = max([lp_noise] + [abs(lp - other[t]) for t, lp in top if t in other])
        q_alone = target_distribution(ids_a, lps_a, g.temperature, g.top_k, g.top_p)
        shifts.append(0.5 * sum(abs(g.q.get(t, 0.0) - q_alone.get(t, 0.0)) for t in set(g.q) | set(q_alone)))
    return {"expected_tv": sum(expected_tv(list(g.q.values()), n) for g in groups) / len(groups),
            "ref_tv": _mean_tv(groups, _samples(groups, ref_outs)), "shift_tv": sum(shifts) / len(shifts),
            "logprob_noise": lp_noise}


def _sampling_checks(groups: list[SamplingGroup], cand_outs: list | None, cal: Calibration,
                     max_seq_len: int) -> list[CheckResult]:
    n_req = sum(len(g.seeds) for g in groups)
    samples = _samples(groups, cand_outs)
    problems = answer_problems(n_req, cand_outs, "generate (sampling batch)")
    problems += ["sampling " + p for p in length_problems(
        _pick(cand_outs, list(range(n_req))) if cand_outs is not None else [], [1] * n_req,
        [len(g.prompt) for g in groups for _ in g.seeds], max_seq_len, exact=[True] * n_req)]
    outside = 0
    sigma = cal.tolerance["sampling_margin"]
    for g, s in zip(groups, samples or []):
        found, count = support_problems(s, g.ids, g.lps, g.temperature, g.top_k, g.top_p, sigma, g.label)
        problems += found
        outside += count
    tvs = [empirical_tv(s, g.q) for g, s in zip(groups, samples)] if samples is not None else []
    value = sum(tvs) / len(tvs) if tvs else None
    tol = cal.tolerance["sampling_tv"]
    greedy = sum(greedy_tv(g.q) for g in groups) / len(groups)
    n = len(groups[0].seeds)
    support = CheckResult.rules("sampling.support", problems, n_req)
    if not problems:
        support = support.model_copy(update={
            "detail": f"{n_req} samples in {len(groups)} settings, all inside the allowed top-k/top-p sets (up to "
                      f"logit noise of {sigma:.3g} nats near the cuts)"})
    return [
        support,
        CheckResult.bounded(
            "sampling.tv", value, upper=tol,
            detail=f"mean total-variation distance between {n} seeded samples and the exact target, over "
                   f"{len(groups)} prompt/setting pairs (reference's own {cal.noise['sampling_ref_tv']:.3f}, "
                   f"expected from sampling noise {cal.noise['sampling_expected_tv']:.3f}; an always-greedy "
                   f"engine would score {greedy:.3f})"
                   + (f"; {outside} samples outside the support" if outside else ""),
            extra={"expected_tv": cal.noise["sampling_expected_tv"], "reference_tv": cal.noise["sampling_ref_tv"],
                   "greedy_tv": greedy, "samples_per_setting": float(n),
                   **{f"tv_{i}": tv for i, tv in enumerate(tvs)}}),
    ]


# --- stop_token_ids ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StopPlan:
    prompts: list[list[int]]
    sampling: list[Sampling]
    expected: list[list[int]]   # the reference's greedy tokens through the stop id
    late: list[int] = field(default_factory=list)  # the stop positions of the late requests (the plan's last ones)


def _stop_request(plan: StopPlan, prompt: Sequence[int], ids: list[int], j: int, eos: set[int], vocab: int) -> None:
    """One request whose stop id is the reference's greedy token at output position j (its first occurrence)."""
    k = len(plan.prompts)
    # alternate: ignore_eos (only the stop id may end it) / EOS on too, where no EOS comes first
    ignore = k % 2 == 0 or any(t in eos for t in ids[: j + 1])
    stops: tuple[int, ...] = (ids[j],)
    if k % 4 >= 2:  # unused stop ids first: every id of the tuple counts, however many come before it
        # one unused id, or STOP_UNUSED: an engine that keeps only the first few ids (a fixed-size stop buffer)
        # would pass requests of one or two ids
        unused = [t for t in range(vocab) if t not in set(ids) and t not in eos][: 1 if k % 4 == 2 else STOP_UNUSED]
        stops = (*unused, ids[j])
    plan.prompts.append(list(prompt))
    plan.sampling.append(Sampling(max_new_tokens=min(j + 1 + STOP_SLACK, len(ids)), ignore_eos=ignore,
                                  stop_token_ids=stops))
    plan.expected.append(ids[: j + 1])


def _stop_plan(sets: dict[str, PromptSet], runs: Runs, eos_ids: list[int], n: int, vocab: int,
               late: PromptSet | None = None) -> StopPlan:
    """Up to n requests stopping early (positions 2..8 of the dev/held-out outputs); then, where n > 0 and the
    late split ran, a few stopping late in its long greedy output (late_stop_positions: past 16, past 64 and its
    last new token), so an engine that honours stop ids only in its first tokens or decode chunk runs past them.
    All share one batch, which runs as long as the latest stop (at most the late split's length)."""
    eos = set(eos_ids)
    plan = StopPlan([], [], [])
    for split, ps in sets.items():
        for prompt, out in zip(ps.prompts, runs.gen[split]):
            if len(plan.prompts) >= n:
                break
            j = stop_position(out.token_ids, eos_ids)
            if j is not None:
                _stop_request(plan, prompt, out.token_ids, j, eos, vocab)
    if n and late is not None and len(late) and runs.gen.get("late"):
        ids = runs.gen["late"][0].token_ids
        for j in late_stop_positions(ids, eos_ids):
            _stop_request(plan, late.prompts[0], ids, j, eos, vocab)
            plan.late.append(j)
    return plan


def _own_late_plan(late: PromptSet | None, own: list | None, eos_ids: list[int], vocab: int) -> StopPlan:
    """Requests stopping late in an engine's OWN long greedy output (late_stop_positions on it), expecting its own
    tokens through each stop. The reference's late stops test nothing once a candidate's text leaves the
    reference's before them, as bf16 rounding at near-ties does in an engine whose kernels differ (the ten-entry
    stack reached none of them on the GPU); asked alone, as its late output was made, an engine repeats its own
    text and reaches every one, so one that honours stop ids only early runs past them however it rounds."""
    plan = StopPlan([], [], [])
    if late is None or not len(late) or not own or own[0] is None:
        return plan
    ids, eos = own[0].token_ids, set(eos_ids)
    for j in late_stop_positions(ids, eos_ids):
        _stop_request(plan, late.prompts[0], ids, j, eos, vocab)
        plan.late.append(j)
    return plan


def _run_alone(engine: EngineHandle, prompts: list[list[int]], sampling: list[Sampling]) -> list | None:
    """Each request in a call of its own (the composition its late output came from); None if any call failed."""
    outs = []
    for p, s in zip(prompts, sampling):
        out = engine.generate([p], [s])
        if out is None or len(out) != 1:
            return None
        outs.append(out[0])
    return outs


def _stop_violations(plan: StopPlan, outs: list | None, eos_ids: list[int]) -> list[str]:
    problems = answer_problems(len(plan.prompts), outs, "generate (stop-id batch)")
    return problems + stop_problems(_pick(outs, list(range(len(plan.prompts)))) if outs is not None else [],
                                    plan.expected, [s.stop_token_ids for s in plan.sampling],
                                    [s.ignore_eos for s in plan.sampling], eos_ids,
                                    [s.max_new_tokens for s in plan.sampling])


def _stop_check(plan: StopPlan, outs: list | None, eos_ids: list[int], own: StopPlan | None = None,
                own_outs: list | None = None) -> CheckResult:
    if not plan.prompts:
        return CheckResult.skip("stop_ids", "no reference output has a token first appearing at positions 2..8 "
                                            "(nor, where the late split runs, past position 16 of its output)")
    own = own or StopPlan([], [], [])
    problems = _stop_violations(plan, outs, eos_ids)
    if own.prompts:
        problems += [f"on its own late output: {p}" for p in _stop_violations(own, own_outs, eos_ids)]
    result = CheckResult.rules("stop_ids", problems, len(plan.prompts) + len(own.prompts))
    if not problems:
        hits = [o.token_ids == e and o.finish_reason == "stop" for o, e in zip(outs, plan.expected)]
        late = (f" ({len(plan.late)} stopping late, at output positions {', '.join(map(str, plan.late))}; "
                f"{sum(hits[len(hits) - len(plan.late):])} of them reached)" if plan.late else "")
        own_hits = sum(o.token_ids == e and o.finish_reason == "stop" for o, e in zip(own_outs or [], own.expected))
        mine = (f"; {len(own.prompts)} more stopping late in the candidate's own late output (positions "
                f"{', '.join(map(str, own.late))}), {own_hits} ended there" if own.prompts else "")
        result = result.model_copy(update={
            "detail": f"{len(plan.prompts)} requests with stop_token_ids{late}; {sum(hits)} ended exactly at the "
                      f"reference's stop position with finish 'stop'{mine}",
            "extra": {**result.extra, "late_requests": float(len(plan.late)),
                      "late_reached": float(sum(hits[len(hits) - len(plan.late):]) if plan.late else 0),
                      "own_late_requests": float(len(own.prompts)), "own_late_reached": float(own_hits)}})
    return result


@dataclass(frozen=True)
class CorrectnessOutcome:
    checks: list[CheckResult]
    calibration: Calibration
    counts: dict[str, int]


def run_correctness(ref: EngineHandle, cand: EngineHandle, wl: GateWorkloads, config: GateConfig,
                    eos_ids: list[int], vocab: int) -> CorrectnessOutcome:
    th = config.thresholds
    rp = _reference_pass(ref, wl, config, eos_ids, vocab)
    # The reference's own-noise runs and the candidate's runs need nothing from each other: run them at once
    # (two engine processes), which halves the wall time of this phase.
    with ThreadPoolExecutor(2) as pool:
        cal_future = pool.submit(_calibration, ref, rp, th, eos_ids, vocab, wl.budget.max_seq_len)
        cand_future = pool.submit(_candidate_runs, cand, wl, rp, th.top_k, eos_ids, vocab)
        cal, (c, c_dev_in_mixed) = cal_future.result(), cand_future.result()
    checks = _checks(ref, wl, config, rp, c, c_dev_in_mixed, cal, eos_ids, vocab)
    return CorrectnessOutcome(checks, cal, _counts(wl, config.checks, rp))


@dataclass
class _ReferencePass:
    """The reference's first runs and the requests they fix: its outputs define the forced continuations, the EOS
    probes and the stop-id requests, its next-token log-probs the sampling groups; the candidate then gets exactly
    these calls."""

    sets: dict[str, PromptSet]    # dev, heldout: every check
    extra: dict[str, PromptSet]   # long_context, late: checked as a few requests, with their own tolerances
    mixed: Mixed
    r: Runs
    r_dev_in_mixed: list
    forced: dict[str, list[list[int]]]
    probe_prompts: list[list[int]]
    probe_sampling: list[Sampling]
    groups: list[SamplingGroup]
    sampling_prompts: list[list[int]]
    sampling_params: list[Sampling]
    sequence_prompts: list[list[int]]
    sequence_params: list[Sampling]
    sequence_groups: list[int]    # each sequence request's index in `groups`
    stop: StopPlan

    @property
    def every(self) -> dict[str, PromptSet]:
        return {**self.sets, **self.extra}


def _reference_pass(ref: EngineHandle, wl: GateWorkloads, config: GateConfig, eos_ids: list[int],
                    vocab: int) -> _ReferencePass:
    th, sizes = config.thresholds, config.checks
    sets = {k: v for k, v in (("dev", wl.dev), ("heldout", wl.heldout)) if len(v)}
    extra = {k: v for k, v in (("long_context", wl.long), ("late", wl.late)) if len(v)}
    mixed = mix(wl.dev, wl.heldout)
    r, r_mixed = _run_generations(ref, wl, mixed)
    _run_extra(ref, r, extra)
    forced = {split: [o.token_ids[: sizes.tf_max_tokens] for o in r.gen[split]] for split in sets}
    forced.update({split: [o.token_ids for o in r.gen[split]] for split in extra})
    _run_scores(ref, r, {**sets, **extra}, forced, th.top_k)
    probe_prompts = _mine_probes(ref, sets, r, set(eos_ids), sizes.n_eos_probes, vocab, wl.chat_probes,
                                 sizes.probe_new_tokens)
    probe_sampling = [Sampling(max_new_tokens=sizes.probe_new_tokens)] * len(probe_prompts)
    r.probes = ref.generate(probe_prompts, probe_sampling) if probe_prompts else []
    groups = _sampling_plan(ref, wl.dev, sizes, wl.nonce, vocab)
    sampling_prompts, sampling_params = _sampling_requests(groups)
    sequences = _sequence_requests(groups, sizes, wl.nonce)
    return _ReferencePass(sets, extra, mixed, r, _pick(r_mixed, mixed.dev_at), forced, probe_prompts,
                          probe_sampling, groups, sampling_prompts, sampling_params, *sequences,
                          _stop_plan(sets, r, eos_ids, sizes.n_stop, vocab, extra.get("late")))


def _calibration(ref: EngineHandle, rp: _ReferencePass, th: GateThresholds, eos_ids: list[int], vocab: int,
                 max_seq_len: int) -> Calibration:
    """The reference's own noise: the same requests in other batch compositions (one at a time, mixed), its
    sampling and stop-id requests; calibrates the tolerances. Raises ReferenceFailure if the reference itself
    breaks the stop_token_ids rules."""
    r, sets, forced = rp.r, rp.sets, rp.forced
    alone_gen = [o for ps in sets.values() for o in _alone(ref, ps)]
    alone_forced = [forced_stats(r.scores[(s, p)], _alone(ref, sets[s], forced[s], p, th.top_k))
                    for s in sets for p in PATHS]
    batched_gen = [o for s in sets for o in r.gen[s]]
    natural = [not sp.ignore_eos for ps in sets.values() for sp in ps.sampling]
    g_agree, len_noise = greedy_noise(batched_gen, alone_gen, natural)
    noise = noise_from_runs(alone_forced, g_agree, len_noise, greedy_agreement(r.gen["dev"], rp.r_dev_in_mixed))
    # The extra splits get their own noise (long contexts may legitimately be noisier), so adding them leaves
    # the dev/held-out tolerances exactly as they were.
    # A one-request split is scored alone already (score/verify run per split): that run would repeat the
    # same composition, so it is skipped (noise 0). The extra splits have no exact-output check, so their
    # greedy outputs need no second run either.
    splits = {s: split_noise([forced_stats(r.scores[(s, p)], _alone(ref, ps, forced[s], p, th.top_k)
                                           if len(ps) > 1 else r.scores[(s, p)]) for p in PATHS],
                             greedy_agreement(r.gen[s], r.gen[s]))
              for s, ps in rp.extra.items()}
    sampling = None
    if rp.groups:
        r.sampling = ref.generate(rp.sampling_prompts, rp.sampling_params)
        prompts = list(dict.fromkeys(g.prompt for g in rp.groups))
        alone = [o for p in prompts for o in ref.score([list(p)], [[0]], top_k=SAMPLING_TOP)]
        sampling = _sampling_noise(rp.groups, r.sampling, alone)
    if rp.sequence_prompts:
        # the reference's own sampled sequences, scored by itself: its deviation is the noise of sampling.sequence
        r.sequences = ref.generate(rp.sequence_prompts, rp.sequence_params)
        scored, own = _scored_sequences(ref, rp, r.sequences, vocab, max_seq_len)
        if own:
            raise ReferenceFailure(f"the reference's sampled sequences cannot be judged: {own[0]}")
        sampling["sequence_deviation"] = _fit(scored).deviation
        sampling["seeded_mismatch"] = 1 - _seeded_agreement(r.sequences, _reversed_sequences(ref, rp),
                                                            _seeded(rp.sequence_params))
    if rp.stop.prompts:
        r.stop = ref.generate(rp.stop.prompts, rp.stop.sampling)
        own = _stop_violations(rp.stop, r.stop, eos_ids)
        if own:
            raise ReferenceFailure(f"the reference breaks the stop_token_ids rules: {own[0]}")
    return calibrate(noise, th, positions=sum(len(f) for s in sets for f in forced[s]),
                     requests=len(batched_gen), splits=splits, sampling=sampling)


def _candidate_runs(cand: EngineHandle, wl: GateWorkloads, rp: _ReferencePass, top_k: int, eos_ids: list[int],
                    vocab: int) -> tuple[Runs, list]:
    """The candidate's replies to the reference's calls, in the same compositions, and its stops late in its own
    late output; and its dev outputs from the mixed batch (the consistency check)."""
    c, c_mixed = _run_generations(cand, wl, rp.mixed)
    _run_extra(cand, c, rp.extra)
    _run_scores(cand, c, rp.every, rp.forced, top_k)
    c.probes = cand.generate(rp.probe_prompts, rp.probe_sampling) if rp.probe_prompts else []
    c.sampling = cand.generate(rp.sampling_prompts, rp.sampling_params) if rp.groups else []
    c.sequences = cand.generate(rp.sequence_prompts, rp.sequence_params) if rp.sequence_prompts else []
    c.sequences_reversed = _reversed_sequences(cand, rp) if rp.sequence_prompts else []
    c.stop = cand.generate(rp.stop.prompts, rp.stop.sampling) if rp.stop.prompts else []
    if rp.stop.prompts:
        c.own_stop = _own_late_plan(rp.extra.get("late"), c.gen.get("late"), eos_ids, vocab)
        c.own_stop_out = _run_alone(cand, c.own_stop.prompts, c.own_stop.sampling)
    return c, _pick(c_mixed, rp.mixed.dev_at)


def _checks(ref: EngineHandle, wl: GateWorkloads, config: GateConfig, rp: _ReferencePass, c: Runs,
            c_dev_in_mixed: list, cal: Calibration, eos_ids: list[int], vocab: int) -> list[CheckResult]:
    """Every named check, in report order: per split, consistency, EOS probes, extra splits, sampling, stop ids."""
    th, sizes = config.thresholds, config.checks
    r, forced, max_seq_len = rp.r, rp.forced, wl.budget.max_seq_len
    checks: list[CheckResult] = []
    for split, ps in rp.sets.items():
        checks += _split_checks(split, ps, r, c, forced[split], cal.tolerance, max_seq_len, eos_ids)
        checks.append(_validity_check(split, ref, ps, c.gen.get(split), th.greedy_margin, cal.tolerance, vocab,
                                      max_seq_len, forced[split], r.scores[(split, "decode")]))
    checks.append(_consistency_check(c.gen.get("dev"), c_dev_in_mixed, cal))
    checks += _probe_checks(rp.probe_prompts, r.probes, c.probes, cal, eos_ids, sizes.probe_new_tokens,
                            max_seq_len, wl.chat_probe_note)
    if sizes.n_long and "long_context" not in rp.extra:
        checks.append(CheckResult.skip("long_context", f"no long-context prompts: {wl.long_note}"))
    for split, ps in rp.extra.items():
        tol = _split_tolerance(cal, split)
        checks += _split_checks(split, ps, r, c, forced[split], tol, max_seq_len, eos_ids, few=True)
        checks.append(_validity_check(split, ref, ps, c.gen.get(split), th.greedy_margin, tol, vocab, max_seq_len,
                                      forced[split], r.scores[(split, "decode")], agreement=greedy_agreement(
                                          r.gen[split], c.gen.get(split))))
    if rp.groups:
        checks += _sampling_checks(rp.groups, c.sampling, cal, max_seq_len)
    if rp.sequence_prompts:
        checks += _sequence_checks(ref, rp, c.sequences, cal, th.sequence_z, vocab, max_seq_len)
        checks.append(_seeded_check(rp, c, cal))
    elif sizes.n_sampling_prompts and len(wl.dev):
        why = f"the vocabulary ({vocab}) is too small for a top-{SAMPLING_TOP} target"
        checks += [CheckResult.skip("sampling.support", why), CheckResult.skip("sampling.tv", why)]
    if sizes.n_stop:
        checks.append(_stop_check(rp.stop, c.stop, eos_ids, c.own_stop, c.own_stop_out))
    return checks


def _counts(wl: GateWorkloads, sizes: CheckSizes, rp: _ReferencePass) -> dict[str, int]:
    """How many prompts, forced positions and requests each check saw (the report's counts)."""
    counts = {"dev_prompts": len(wl.dev), "heldout_prompts": len(wl.heldout), "eos_probes": len(rp.probe_prompts),
              **{f"{s}_forced_positions": sum(map(len, rp.forced[s])) for s in rp.sets}}
    if rp.extra:
        counts.update({f"{s}_prompts": len(rp.extra[s]) for s in rp.extra})
        counts.update({f"{s}_forced_positions": sum(map(len, rp.forced[s])) for s in rp.extra})
        counts.update({f"{s}_prompt_tokens": max(map(len, rp.extra[s].prompts)) for s in rp.extra})
    if rp.groups:
        counts["sampling_requests"] = len(rp.sampling_prompts)
    if rp.sequence_prompts:
        counts["sampled_sequences"] = len(rp.sequence_prompts)
    if sizes.n_stop:
        counts["stop_requests"] = len(rp.stop.prompts)
    return counts


def _split_tolerance(cal: Calibration, split: str) -> dict[str, float]:
    """The dev/held-out tolerances, with an extra split's own calibrated ones where it has them."""
    return {**cal.tolerance, **{k.removeprefix(f"{split}."): v for k, v in cal.tolerance.items()
                                if k.startswith(f"{split}.")}}


def _split_checks(split: str, ps: PromptSet, r: Runs, c: Runs, forced: list[list[int]], tol: dict[str, float],
                  max_seq_len: int, eos_ids: list[int], few: bool = False) -> list[CheckResult]:
    """few: a split of a handful of requests (long_context, late). Its exact-output rate cannot be judged (with two
    prompts one bf16 near-tie halves it; the GPU run of a legitimate kernel change scored 0.5), so greedy
    behaviour is judged by greedy_valid alone; and its top-1 bound gets the small-sample slack of its positions."""
    cand_gen = c.gen.get(split)
    answered = list(c.gen_problems.get(split, []))
    for path in PATHS:
        answered += answer_problems(len(ps), c.scores.get((split, path)), path, [len(f) for f in forced])
    agree = greedy_agreement(r.gen[split], cand_gen)
    natural = [not s.ignore_eos for s in ps.sampling]
    exact_len = [s.ignore_eos and not s.stop_token_ids for s in ps.sampling]
    out = [
        CheckResult.rules(f"{split}.answered", answered, len(ps)),
        CheckResult.rules(f"{split}.lengths", length_problems(cand_gen, [s.max_new_tokens for s in ps.sampling],
                                                              [len(p) for p in ps.prompts], max_seq_len, exact_len),
                          len(ps)),
        CheckResult.rules(f"{split}.eos", eos_problems(cand_gen, [s.ignore_eos for s in ps.sampling], eos_ids,
                                                       [s.stop_token_ids for s in ps.sampling]), len(ps)),
    ]
    if not few:
        out.append(CheckResult.bounded(f"{split}.greedy_exact", agree.exact_rate, lower=1 - tol["greedy"],
                                       detail=f"token-exact {agree.exact_rate:.3f} of {agree.requests} requests, "
                                              f"mean first divergence at token {agree.mean_first_divergence:.1f}",
                                       extra={"mean_first_divergence": agree.mean_first_divergence,
                                              "requests": float(agree.requests)}))
    if any(natural):
        ratio = length_ratio(r.gen[split], cand_gen, natural)
        out.append(CheckResult.bounded(f"{split}.natural_length", ratio, 1 - tol["length"], 1 + tol["length"],
                                       detail=f"sum of output lengths, candidate / reference, over "
                                              f"{sum(natural)} EOS-on requests"))
    for path in PATHS:
        st = forced_stats(r.scores[(split, path)], c.scores.get((split, path)))
        pos = {"positions": float(st.positions), "expected_positions": float(st.expected_positions)}
        where = f"{st.positions} of {st.expected_positions} forced positions ({path} path)"
        out += [
            CheckResult.bounded(f"{split}.{path}.kl", st.kl, upper=tol["kl"],
                                detail=f"mean KL(ref||cand) on the reference's top-k, {where}", extra=pos),
            CheckResult.bounded(f"{split}.{path}.top1", st.top1,
                                lower=1 - tol["top1"] - (small_sample_slack(tol["top1"], st.expected_positions)
                                                         if few else 0.0),
                                detail=f"top-1 agreement, {where}", extra=pos),
            CheckResult.bounded(f"{split}.{path}.ppl_ratio", st.ppl_ratio, math.exp(-tol["ppl"]), math.exp(tol["ppl"]),
                                detail=f"perplexity of the forced tokens, cand/ref, {where}", extra=pos),
        ]
    return out


def _validity_check(split: str, ref: EngineHandle, ps: PromptSet, outs: list | None, margin: float,
                    tol: dict[str, float], vocab: int, max_seq_len: int, forced: list[list[int]] | None = None,
                    forced_scores: list[ScoreOut] | None = None, agreement=None) -> CheckResult:
    """The candidate's own greedy outputs, teacher-forced through the reference: every token should be the
    reference's top-1 up to a near-tie. Robust where exact agreement is not (after a bf16 near-tie the outputs
    go separate ways, yet each stays a valid greedy continuation), and it catches made-up or misplaced outputs.
    An output identical to the reference's forced continuation reuses the reference's decode-path score of it
    (the same call on the same tokens) instead of scoring it again."""
    total = bad = 0
    prompts, conts, known = [], [], []
    for i, (prompt, sp, out) in enumerate(zip(ps.prompts, ps.sampling, outs or [])):
        if out is None or sp.temperature > 0:
            continue  # missing replies are the "answered" check's business
        total += max(len(out.token_ids), 1)
        if forced is not None and forced_scores is not None and i < len(forced) and out.token_ids == forced[i]:
            known.append(forced_scores[i])
        elif scoreable(prompt, out, sp.max_new_tokens, vocab, max_seq_len):
            prompts.append(list(prompt))
            conts.append(out.token_ids)
        else:
            bad += max(len(out.token_ids), 1)
    valid = near_argmax(ref.score(prompts, conts, top_k=1), margin) if prompts else 0
    valid += near_argmax(known, margin)
    rate = valid / total if total else None
    # a split of a few requests (agreement given) gets the small-sample slack of its token count
    slack = small_sample_slack(tol["top1"], total) if agreement is not None else 0.0
    same = "" if agreement is None else (f"; token-exact {agreement.exact_rate:.3f} of {agreement.requests} outputs, "
                                         f"mean first divergence at token {agreement.mean_first_divergence:.1f}")
    return CheckResult.bounded(f"{split}.greedy_valid", rate, lower=1 - tol["top1"] - slack,
                               detail=f"{valid} of {total} generated tokens are the reference's top-1 within "
                                      f"{margin:g} nats, scored on the candidate's own outputs"
                                      + (f"; {bad} tokens in unscoreable outputs" if bad else "") + same)


def _consistency_check(dev: list | None, dev_in_mixed: list, cal: Calibration) -> CheckResult:
    """The same dev prompts, answered in the dev batch and inside the held-out batch, must agree."""
    dev = dev or []
    pairs = [(a, b) for a, b in zip(dev, dev_in_mixed) if a is not None]
    same = sum(b is not None and a.token_ids == b.token_ids for a, b in pairs)
    if not pairs:
        return CheckResult.bounded("dev_heldout.consistency", None, lower=1 - cal.tolerance["consistency"],
                                   detail="no dev outputs to compare")
    firsts = [first_divergence(a.token_ids, b.token_ids if b else []) for a, b in pairs]
    rate = same / len(pairs)
    return CheckResult.bounded("dev_heldout.consistency", rate, lower=1 - cal.tolerance["consistency"],
                               detail=f"{same} of {len(pairs)} dev prompts gave identical tokens in the dev batch "
                                      f"and inside the held-out batch (mean first divergence "
                                      f"{sum(firsts) / len(firsts):.1f})")


def _probe_checks(prompts: list[list[int]], ref: list[GenerationOut], cand: list | None, cal: Calibration,
                  eos_ids: list[int], new_tokens: int, max_seq_len: int, chat_note: str = "") -> list[CheckResult]:
    stopping = [i for i, o in enumerate(ref) if o.finish_reason == "stop"]
    if not stopping:
        why = "no EOS probe: the reference never produced an EOS on these prompts" + (
            f" (no chat probes: {chat_note})" if chat_note else "")
        return [CheckResult.skip("eos_probe.stops", why), CheckResult.skip("eos_probe.eos", why)]
    cand_al = _pick(cand, list(range(len(prompts))))
    same = sum(cand_al[i] is not None and cand_al[i].finish_reason == "stop"
               and cand_al[i].token_ids == ref[i].token_ids for i in stopping)
    rate = same / len(stopping)
    return [
        CheckResult.bounded("eos_probe.stops", rate, lower=1 - cal.tolerance["greedy"],
                            detail=f"{same} of {len(stopping)} prompts whose greedy continuation reaches an EOS "
                                   f"within {new_tokens} tokens ended there with finish 'stop', with the "
                                   f"reference's tokens"),
        CheckResult.rules("eos_probe.eos", eos_problems(cand_al, [False] * len(prompts), eos_ids)
                          + length_problems(cand_al, [new_tokens] * len(prompts), [len(p) for p in prompts],
                                            max_seq_len), len(prompts)),
    ]
