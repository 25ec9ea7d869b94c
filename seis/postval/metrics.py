"""Flat metrics and plot data for DVC (`dvc metrics show`, `dvc plots show`)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from .result import PostValResult


def flat_metrics(result: PostValResult) -> dict:
    """Numbers only, grouped: accuracy per task, speedup per workload and mode (median of paired repetitions)."""
    metrics: dict = {}
    for a in result.accuracy:
        metrics[a.task] = {"candidate_acc": a.candidate_acc, "vanilla_acc": a.vanilla_acc,
                           "delta_points": a.delta_points, "items": a.items, "flagged": int(a.flagged),
                           "unbacked": a.unbacked}
    metrics["speedup"] = {f"{c.workload}-{c.mode}": round(c.speedup.median, 4)
                          for c in result.speed + result.workloads}
    # The candidate's timed outputs against vanilla's: a flagged row's speedup is not trustworthy.
    metrics["timed"] = {f"{c.workload}-{c.mode}": {"valid_frac": round(c.timed.valid_frac, 4),
                                                   "identical_frac": round(c.timed.identical_frac, 4),
                                                   "length_ratio": round(c.timed.length_ratio, 4),
                                                   "flagged": int(c.timed.flagged)}
                        for c in result.speed + result.workloads if c.timed is not None}
    metrics["timed_flagged"] = int(result.timed_flagged)
    metrics["wall_s"] = round(result.wall_s, 1)
    return metrics


def write_metrics(result: PostValResult, out: Path) -> dict[str, str]:
    (out / "metrics.json").write_text(json.dumps(flat_metrics(result), indent=2) + "\n", encoding="utf-8")
    with open(out / "throughput.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["workload", "mode", "engine", "tok_per_s", "tok_per_s_min", "tok_per_s_max"])
        for c in result.speed + result.workloads:
            for m in (c.vanilla, c.candidate):
                w.writerow([c.workload, c.mode, m.engine, round(m.tok_per_s.median, 2), round(m.tok_per_s.min, 2),
                            round(m.tok_per_s.max, 2)])
    return {"metrics.json": str(out / "metrics.json"), "throughput.csv": str(out / "throughput.csv")}
