"""Thresholds from the reference's own noise.

The reference runs the check prompts twice: batched (the composition the candidate is compared in) and one
request at a time. Whatever differs between the two is numerical noise a correct engine may legitimately show
(on GPU bf16, other GEMM shapes round differently; on CPU fp32 it is ~0). Each tolerance is
min(cap, max(floor, factor * noise)), so an engine exactly as noisy as the reference passes with margin while a
broken one (a skipped layer, perturbed logits) is far outside.
"""
from __future__ import annotations

from collections.abc import Sequence

from .checks import Agreement, ForcedStats, greedy_agreement, length_ratio, tolerance
from .config import GateThresholds
from .engines import GenerationOut
from .schema import Calibration

METHOD = ("reference vs reference: batched (the compared composition) vs one request at a time for teacher "
          "forcing (decode and M-row paths) and greedy outputs; dev prompts in the dev batch vs inside the "
          "held-out batch for consistency; tolerance = min(cap, max(floor, factor * noise))")


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


def calibrate(noise: dict[str, float], th: GateThresholds, positions: int, requests: int) -> Calibration:
    tol = {
        "kl": tolerance(th.kl_floor, th.kl_factor, noise["kl"], th.kl_cap),
        "top1": tolerance(th.top1_floor, th.top1_factor, noise["top1"], th.top1_cap),
        "ppl": tolerance(th.ppl_floor, th.ppl_factor, noise["ppl"], th.ppl_cap),
        "greedy": tolerance(th.greedy_floor, th.greedy_factor, noise["greedy"], th.greedy_cap),
        "length": tolerance(th.length_floor, th.length_factor, noise["length"], th.length_cap),
        "consistency": tolerance(th.consistency_floor, th.consistency_factor, noise["consistency"],
                                 th.consistency_cap),
    }
    return Calibration(method=METHOD, noise=noise, tolerance=tol, positions=positions, requests=requests)
