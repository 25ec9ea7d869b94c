"""Correctness: the candidate against the reference on the same prompts, in the same batch compositions.

Order of work: the reference runs everything first (its outputs define the forced continuations and the EOS
probes, and its second, differently-batched run calibrates the thresholds); then the candidate runs the same
calls; then pure functions (checks.py) turn the two into named checks.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..engine_host.client import Sampling
from .calibration import calibrate, greedy_noise, noise_from_runs
from .checks import (
    answer_problems,
    eos_problems,
    first_divergence,
    forced_stats,
    greedy_agreement,
    length_problems,
    length_ratio,
    near_argmax,
    scoreable,
)
from .config import GateConfig
from .engines import EngineHandle, GenerationOut, ScoreOut
from .schema import Calibration, CheckResult
from .workloads import GateWorkloads, PromptSet

PATHS = ("decode", "verify")   # score(): one decode step per token; verify(): M rows in one forward step
SCAN_IDS = 512                 # single-token prompts scanned for EOS probes when no output contained an EOS


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


def _run_generations(engine: EngineHandle, wl: GateWorkloads, mixed: Mixed) -> tuple[Runs, list | None]:
    runs = Runs()
    dev = engine.generate(wl.dev.prompt_lists(), list(wl.dev.sampling))
    runs.gen["dev"] = _pick(dev, list(range(len(wl.dev))))
    runs.gen_problems["dev"] = answer_problems(len(wl.dev), dev, "generate (dev batch)")
    mixed_out = engine.generate(mixed.prompts.prompt_lists(), list(mixed.prompts.sampling))
    runs.gen["heldout"] = _pick(mixed_out, mixed.heldout_at)
    runs.gen_problems["heldout"] = answer_problems(len(mixed.prompts), mixed_out, "generate (held-out batch)")
    return runs, mixed_out


def _run_scores(engine: EngineHandle, runs: Runs, sets: dict[str, PromptSet], forced: dict[str, list[list[int]]],
                top_k: int) -> None:
    for split, ps in sets.items():
        for path in PATHS:
            fn = engine.score if path == "decode" else engine.verify
            runs.scores[(split, path)] = fn(ps.prompt_lists(), forced[split], top_k)


def _mine_probes(ref: EngineHandle, sets: dict[str, PromptSet], runs: Runs, eos: set[int], n: int,
                 vocab: int) -> list[list[int]]:
    """Prompts after which the reference's greedy next token is an EOS: every prompt + output prefix that the
    reference ended (or, with ignore_eos, continued past) an EOS at; else single-token prompts that do."""
    if n == 0:
        return []
    probes: list[list[int]] = []
    for split, ps in sets.items():
        for prompt, out in zip(ps.prompts, runs.gen[split]):
            cut = next((t for t, tok in enumerate(out.token_ids) if tok in eos), None)
            probe = list(prompt) + out.token_ids[:cut] if cut is not None else None
            if probe and probe not in probes:
                probes.append(probe)
    if len(probes) < n:
        scan = [[t] for t in range(min(vocab, SCAN_IDS)) if t not in eos]
        outs = ref.generate(scan, [Sampling(max_new_tokens=1, ignore_eos=True)] * len(scan))
        probes += [p for p, o in zip(scan, outs) if o.token_ids and o.token_ids[0] in eos]
    return probes[:n]


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


@dataclass(frozen=True)
class CorrectnessOutcome:
    checks: list[CheckResult]
    calibration: Calibration
    counts: dict[str, int]


def run_correctness(ref: EngineHandle, cand: EngineHandle, wl: GateWorkloads, config: GateConfig,
                    eos_ids: list[int], vocab: int) -> CorrectnessOutcome:
    th, sizes = config.thresholds, config.checks
    sets = {k: v for k, v in (("dev", wl.dev), ("heldout", wl.heldout)) if len(v)}
    mixed = mix(wl.dev, wl.heldout)
    eos = set(eos_ids)

    # --- reference: outputs, forced continuations, EOS probes, and its own noise --------------------------------
    r, r_mixed = _run_generations(ref, wl, mixed)
    r_dev_in_mixed = _pick(r_mixed, mixed.dev_at)
    forced = {split: [o.token_ids[: sizes.tf_max_tokens] for o in r.gen[split]] for split in sets}
    _run_scores(ref, r, sets, forced, th.top_k)
    probe_prompts = _mine_probes(ref, sets, r, eos, sizes.n_eos_probes, vocab)
    probe_sampling = [Sampling(max_new_tokens=sizes.probe_new_tokens)] * len(probe_prompts)
    r.probes = ref.generate(probe_prompts, probe_sampling) if probe_prompts else []

    def calibration() -> Calibration:
        alone_gen = [o for ps in sets.values() for o in _alone(ref, ps)]
        alone_forced = [forced_stats(r.scores[(s, p)], _alone(ref, sets[s], forced[s], p, th.top_k))
                        for s in sets for p in PATHS]
        batched_gen = [o for s in sets for o in r.gen[s]]
        natural = [not sp.ignore_eos for ps in sets.values() for sp in ps.sampling]
        g_agree, len_noise = greedy_noise(batched_gen, alone_gen, natural)
        noise = noise_from_runs(alone_forced, g_agree, len_noise, greedy_agreement(r.gen["dev"], r_dev_in_mixed))
        return calibrate(noise, th, positions=sum(len(f) for fs in forced.values() for f in fs),
                         requests=len(batched_gen))

    def candidate_runs() -> tuple[Runs, list]:  # the same calls, the same compositions
        c, c_mixed = _run_generations(cand, wl, mixed)
        _run_scores(cand, c, sets, forced, th.top_k)
        c.probes = cand.generate(probe_prompts, probe_sampling) if probe_prompts else []
        return c, _pick(c_mixed, mixed.dev_at)

    # The reference's own-noise runs and the candidate's runs need nothing from each other: run them at once
    # (two engine processes), which halves the wall time of this phase.
    with ThreadPoolExecutor(2) as pool:
        cal_future, cand_future = pool.submit(calibration), pool.submit(candidate_runs)
        cal, (c, c_dev_in_mixed) = cal_future.result(), cand_future.result()

    checks: list[CheckResult] = []
    for split, ps in sets.items():
        checks += _split_checks(split, ps, r, c, forced[split], cal, wl.budget.max_seq_len, eos_ids)
        checks.append(_validity_check(split, ref, ps, c.gen.get(split), th.greedy_margin, cal, vocab,
                                      wl.budget.max_seq_len))
    checks.append(_consistency_check(c.gen.get("dev"), c_dev_in_mixed, cal))
    checks += _probe_checks(probe_prompts, r.probes, c.probes, cal, eos_ids, sizes.probe_new_tokens,
                            wl.budget.max_seq_len)
    counts = {"dev_prompts": len(wl.dev), "heldout_prompts": len(wl.heldout), "eos_probes": len(probe_prompts),
              **{f"{s}_forced_positions": sum(map(len, forced[s])) for s in sets}}
    return CorrectnessOutcome(checks, cal, counts)


def _split_checks(split: str, ps: PromptSet, r: Runs, c: Runs, forced: list[list[int]], cal: Calibration,
                  max_seq_len: int, eos_ids: list[int]) -> list[CheckResult]:
    tol = cal.tolerance
    cand_gen = c.gen.get(split)
    answered = list(c.gen_problems.get(split, []))
    for path in PATHS:
        answered += answer_problems(len(ps), c.scores.get((split, path)), path, [len(f) for f in forced])
    agree = greedy_agreement(r.gen[split], cand_gen)
    natural = [not s.ignore_eos for s in ps.sampling]
    out = [
        CheckResult.rules(f"{split}.answered", answered, len(ps)),
        CheckResult.rules(f"{split}.lengths", length_problems(cand_gen, [s.max_new_tokens for s in ps.sampling],
                                                              [len(p) for p in ps.prompts], max_seq_len), len(ps)),
        CheckResult.rules(f"{split}.eos", eos_problems(cand_gen, [s.ignore_eos for s in ps.sampling], eos_ids,
                                                       [s.stop_token_ids for s in ps.sampling]), len(ps)),
        CheckResult.bounded(f"{split}.greedy_exact", agree.exact_rate, lower=1 - tol["greedy"],
                            detail=f"token-exact {agree.exact_rate:.3f} of {agree.requests} requests, mean first "
                                   f"divergence at token {agree.mean_first_divergence:.1f}",
                            extra={"mean_first_divergence": agree.mean_first_divergence,
                                   "requests": float(agree.requests)}),
    ]
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
            CheckResult.bounded(f"{split}.{path}.top1", st.top1, lower=1 - tol["top1"],
                                detail=f"top-1 agreement, {where}", extra=pos),
            CheckResult.bounded(f"{split}.{path}.ppl_ratio", st.ppl_ratio, math.exp(-tol["ppl"]), math.exp(tol["ppl"]),
                                detail=f"perplexity of the forced tokens, cand/ref, {where}", extra=pos),
        ]
    return out


def _validity_check(split: str, ref: EngineHandle, ps: PromptSet, outs: list | None, margin: float,
                    cal: Calibration, vocab: int, max_seq_len: int) -> CheckResult:
    """The candidate's own greedy outputs, teacher-forced through the reference: every token should be the
    reference's top-1 up to a near-tie. Robust where exact agreement is not (after a bf16 near-tie the outputs
    go separate ways, yet each stays a valid greedy continuation), and it catches made-up or misplaced outputs."""
    total = bad = 0
    prompts, conts = [], []
    for prompt, sp, out in zip(ps.prompts, ps.sampling, outs or []):
        if out is None or sp.temperature > 0:
            continue  # missing replies are the "answered" check's business
        total += max(len(out.token_ids), 1)
        if scoreable(prompt, out, sp.max_new_tokens, vocab, max_seq_len):
            prompts.append(list(prompt))
            conts.append(out.token_ids)
        else:
            bad += max(len(out.token_ids), 1)
    valid = near_argmax(ref.score(prompts, conts, top_k=1), margin) if prompts else 0
    rate = valid / total if total else None
    return CheckResult.bounded(f"{split}.greedy_valid", rate, lower=1 - cal.tolerance["top1"],
                               detail=f"{valid} of {total} generated tokens are the reference's top-1 within "
                                      f"{margin:g} nats, scored on the candidate's own outputs"
                                      + (f"; {bad} tokens in unscoreable outputs" if bad else ""))


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
                  eos_ids: list[int], new_tokens: int, max_seq_len: int) -> list[CheckResult]:
    stopping = [i for i, o in enumerate(ref) if o.finish_reason == "stop"]
    if not stopping:
        why = "no EOS probe: the reference never produced an EOS on these prompts"
        return [CheckResult.skip("eos_probe.stops", why), CheckResult.skip("eos_probe.eos", why)]
    cand_al = _pick(cand, list(range(len(prompts))))
    same = sum(cand_al[i] is not None and cand_al[i].finish_reason == "stop"
               and cand_al[i].token_ids == ref[i].token_ids for i in stopping)
    rate = same / len(stopping)
    return [
        CheckResult.bounded("eos_probe.stops", rate, lower=1 - cal.tolerance["greedy"],
                            detail=f"{same} of {len(stopping)} prompts whose greedy next token is an EOS ended "
                                   f"there with finish 'stop', as the reference's did"),
        CheckResult.rules("eos_probe.eos", eos_problems(cand_al, [False] * len(prompts), eos_ids)
                          + length_problems(cand_al, [new_tokens] * len(prompts), [len(p) for p in prompts],
                                            max_seq_len), len(prompts)),
    ]
