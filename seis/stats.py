"""Summaries of repeated timings (the gate's speed measurement and the benchmarks use them)."""
from __future__ import annotations

import statistics


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def fmt_range(s: dict, digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"
