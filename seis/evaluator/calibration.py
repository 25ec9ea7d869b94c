"""Thresholds from the reference's own noise.

The reference runs the check prompts twice: batched (the composition the candidate is compared in) and one
request at a time. Whatever differs between the two is numerical noise a correct engine may legitimately show
(on GPU bf16, other GEMM shapes round differently; on CPU fp32 it is ~0). Each tolerance is
min(cap, max(floor, factor * noise)), so an engine exactly as noisy as the reference passes with margin while a
broken one (a skipped layer, perturbed logits) is far outside.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from .checks import Agreement, ForcedStats, greedy_agreement, length_ratio, tolerance
from .engines import GenerationOut
from .gate_config import GateThresholds
from .schema import Calibration

METHOD = ("reference vs reference: batched (the compared composition) vs one request at a time for teacher "
          "forcing (decode and M-row paths) and greedy outputs; dev prompts in the dev batch vs inside the "
          "held-out batch for consistency; tolerance = min(cap, max(floor, factor * noise)). Long-context and "
          "late-position splits: the same, from their own requests (keys '<split>.<metric>'). Sampling: the "
          "reference's own TV to the exact target on the same seeded requests; floor = tv_floor_factor * the "
          "analytic expected TV of n exact samples + tv_shift_factor * the TV between targets from the reference's "
          "batched and one-at-a-time log-probs; support noise scale from the larger of that log-prob difference and "
          "sqrt(2 * the KL noise); sampled sequences: a shift from the reference's own mean log q(x) + H(q) on "
          "its own seeded multi-token samples; seeded: the reference's own mismatch between the same seeded requests "
          "in two batch orders")

SPLIT_METRICS = ("kl", "top1", "ppl", "greedy")


def noise_from_runs(forced: Sequence[ForcedStats], greedy: Agreement, length_noise: float,
                    consistency: Agreement) -> dict[str, float]:
    return {
        "kl": max((s.kl for s in forced), default=0.0),
        "top1": max((1.0 - s.top1 for s in forced), default=0.0),
        "ppl": max((s.log_ppl_ratio for s in forced), default=0.0),
        "greedy": 1.0 - greedy.exact_rate,
        "length": length_noise,
        # a batch-composition change, like batched-vs-alone: the larger of the two is the noise
        "consistency": max(1.0 - consistency.exact_rate, 1.0 - greedy.exact_rate),
    }


def greedy_noise(batched: Sequence[GenerationOut], alone: Sequence[GenerationOut],
                 natural: Sequence[bool]) -> tuple[Agreement, float]:
    return greedy_agreement(batched, alone), abs(length_ratio(batched, alone, natural) - 1.0)


def split_noise(forced: Sequence[ForcedStats], greedy: Agreement) -> dict[str, float]:
    """One extra split's own noise (teacher forcing on both paths, greedy outputs), batched vs alone."""
    base = noise_from_runs(forced, greedy, 0.0, greedy)
    return {k: base[k] for k in SPLIT_METRICS}


def sampling_tolerances(th: GateThresholds, expected_tv: float, ref_tv: float, shift_tv: float,
                        logprob_noise: float) -> dict[str, float]:
    """sampling.tv's tolerance and sampling.support's margin (nats)."""
    shift = shift_tv if math.isfinite(shift_tv) else 0.0
    floor = th.tv_floor_factor * expected_tv + th.tv_shift_factor * shift
    return {"sampling_tv": tolerance(floor, th.tv_factor, ref_tv, th.tv_cap),
            "sampling_margin": tolerance(th.sampling_margin_floor, th.sampling_margin_factor, logprob_noise,
                                         th.sampling_margin_cap)}


def calibrate(noise: dict[str, float], th: GateThresholds, positions: int, requests: int,
              splits: dict[str, dict[str, float]] | None = None,
              sampling: dict[str, float] | None = None) -> Calibration:
    """splits: an extra split's own noise (split_noise), calibrated into '<split>.<metric>' keys. sampling: keys
    expected_tv, ref_tv, shift_tv, logprob_noise (recorded as 'sampling_*' noise)."""
    tol = {
        "kl": tolerance(th.kl_floor, th.kl_factor, noise["kl"], th.kl_cap),
        "top1": tolerance(th.top1_floor, th.top1_factor, noise["top1"], th.top1_cap),
        "ppl": tolerance(th.ppl_floor, th.ppl_factor, noise["ppl"], th.ppl_cap),
        "greedy": tolerance(th.greedy_floor, th.greedy_factor, noise["greedy"], th.greedy_cap),
        "length": tolerance(th.length_floor, th.length_factor, noise["length"], th.length_cap),
        "consistency": tolerance(th.consistency_floor, th.consistency_factor, noise["consistency"],
                                 th.consistency_cap),
    }
    noise = dict(noise)
    floors = {"kl": (th.kl_floor, th.kl_factor, th.kl_cap), "top1": (th.top1_floor, th.top1_factor, th.top1_cap),
              "ppl": (th.ppl_floor, th.ppl_factor, th.ppl_cap),
              "greedy": (th.greedy_floor, th.greedy_factor, th.greedy_cap)}
    for split, sn in (splits or {}).items():
        for k in SPLIT_METRICS:
            floor, factor, cap = floors[k]
            noise[f"{split}.{k}"] = sn[k]
            tol[f"{split}.{k}"] = tolerance(floor, factor, sn[k], cap)
    if sampling is not None:
        noise.update({f"sampling_{k}": v for k, v in sampling.items()})
        # the logit noise scale a KL of this size implies (KL ~ var / 2 for small perturbations)
        noise["sampling_kl_logit_scale"] = math.sqrt(2 * noise["kl"]) if math.isfinite(noise["kl"]) else 0.0
        tol.update(sampling_tolerances(th, sampling["expected_tv"], sampling["ref_tv"], sampling["shift_tv"],
                                       max(sampling["logprob_noise"], noise["sampling_kl_logit_scale"])))
        if "sequence_deviation" in sampling:  # sampling.sequence's shift (its z standard errors come on top)
            dev = abs(sampling["sequence_deviation"])
            tol["sampling_sequence"] = tolerance(th.sequence_shift_floor, th.sequence_shift_factor, dev,
                                                 th.sequence_shift_cap)
        if "seeded_mismatch" in sampling:  # sampling.seeded: same seeds, another batch order
            tol["sampling_seeded"] = tolerance(th.seeded_floor, th.seeded_factor, sampling["seeded_mismatch"],
                                               th.seeded_cap)
    return Calibration(method=METHOD, noise=noise, tolerance=tol, positions=positions, requests=requests)
