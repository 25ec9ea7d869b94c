"""Tables of a post-validation result: pandas DataFrames saved as parquet, and markdown for humans.

Every table carries the accuracy verdict (an `accuracy_flag` column in parquet, a status line in markdown),
so a speed number is never read without knowing whether the engine still answers like vanilla; every speed row
also carries the check of its own timed outputs against vanilla's (`timed_*` columns, `timed_flag`): a flagged
row's speed figure is not trustworthy.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from .. import tables
from .result import PostValResult, SpeedComparison, Spread, context_flag

if TYPE_CHECKING:
    import pandas as pd

FLAG = "⚠"


def fmt_spread(s: Spread | None, digits: int = 1) -> str:
    if s is None:
        return "–"
    return f"{s.median:.{digits}f} ({s.min:.{digits}f}–{s.max:.{digits}f})"


def _num(v: float | None, digits: int = 1, signed: bool = False) -> str:
    if v is None:
        return "–"
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def accuracy_status(result: PostValResult) -> str:
    """One line: every accuracy delta, and whether any is outside the flag threshold; before it, a line flagging a
    context the candidate's word cut below vanilla's."""
    t = result.config.flag_points
    parts = [f"{a.task} {_num(a.delta_points, 1, True)} pts" for a in result.accuracy]
    body = ", ".join(parts) if parts else "not measured"
    cut = (f"{FLAG} **{context_flag(result.context_tokens, result.vanilla_context_tokens)}**\n"
           if result.context_flagged else "")
    unbacked = [f"{a.unbacked} {a.task}" for a in result.accuracy if a.unbacked]
    if unbacked:  # answers that are not the model's: counted wrong (accuracy.unbacked_answers)
        cut += (f"{FLAG} **Correct answers that vanilla would not have produced (counted wrong): "
                f"{', '.join(unbacked)}**\n")
    if any(a.flagged for a in result.accuracy):
        return f"{cut}{FLAG} **Accuracy differs from vanilla beyond ±{t:g} points** ({body})."
    return f"{cut}Accuracy vs vanilla within ±{t:g} points ({body})."


def timed_status(result: PostValResult) -> str:
    """One line: whether the candidate's timed outputs matched vanilla's in every speed row."""
    c = result.config
    rule = (f"the gate's timed checks: timed tokens vanilla's top-1 within {c.timed_margin:g} nats ≥ "
            f"{c.timed_min_valid:g}, every stop within the stop margin, natural length within "
            f"±{100 * c.timed_length_tolerance:g} % where the texts agree up to a stop, no one-sided early ends")
    bad = [f"{s.workload}/{s.mode}" for s in result.speed + result.workloads if s.timed_flagged]
    if bad:
        return (f"{FLAG} **Timed outputs differ from vanilla's in {', '.join(bad)}** ({rule}): "
                f"those speed figures are not trustworthy.")
    if not result.speed + result.workloads:
        return "No timed outputs."
    return f"Timed outputs checked against vanilla's for the same requests ({rule})."


def _status(result: PostValResult) -> str:
    return provenance_line(result) + accuracy_status(result) + "\n" + timed_status(result)


def provenance_line(result: PostValResult) -> str:
    """What the figures were measured on: the device by name, the model and its weights, the commit."""
    if not result.device_name:  # a result written before these were recorded
        return ""
    return (f"Measured on {result.device_name}, model {result.config.model} ({result.weights}), commit "
            f"{result.commit}.\n")


# ---- DataFrames (parquet: plain numbers) ---------------------------------------------------------------------

def accuracy_frame(result: PostValResult) -> pd.DataFrame:
    import pandas as pd

    rows = [{**a.model_dump(), "flag_points": result.config.flag_points} for a in result.accuracy]
    cols = ["task", "items", "skipped", "vanilla_acc", "candidate_acc", "delta_points", "candidate_only",
            "vanilla_only", "identical_outputs", "flagged", "unbacked", "flag_points"]
    return pd.DataFrame(rows, columns=cols)


def _speed_row(c: SpeedComparison, flagged: bool) -> dict:
    row = {"workload": c.workload, "kind": c.kind, "mode": c.mode, "requests": c.requests,
           "prompt_len_mean": c.prompt_len_mean, "max_new_tokens": c.max_new_tokens, "ignore_eos": c.ignore_eos}
    for name, m in (("vanilla", c.vanilla), ("candidate", c.candidate)):
        row |= {f"{name}_tok_s": m.tok_per_s.median, f"{name}_tok_s_min": m.tok_per_s.min,
                f"{name}_tok_s_max": m.tok_per_s.max, f"{name}_bound_tok_s": m.bound_tok_per_s,
                f"{name}_out_tokens_mean": m.output_lengths.mean,
                f"{name}_j_per_token": m.energy_j_per_token.median if m.energy_j_per_token else None}
    t = c.timed
    row |= {"speedup": c.speedup.median, "speedup_min": c.speedup.min, "speedup_max": c.speedup.max,
            "requested": c.requested, "distinct_prompts": c.distinct_prompts,
            "timed_valid_frac": t.valid_frac if t else None,
            "timed_identical_frac": t.identical_frac if t else None,
            "timed_first_divergence": t.first_divergence_mean if t else None,
            "timed_length_ratio": t.length_ratio if t else None, "timed_missing": t.missing if t else None,
            "timed_over_length": t.over_length if t else None, "timed_flag": c.timed_flagged,
            "accuracy_flag": flagged}
    return row


def speed_frame(result: PostValResult) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame([_speed_row(c, result.accuracy_flagged) for c in result.speed])


def workload_frame(result: PostValResult) -> pd.DataFrame:
    import pandas as pd

    rows = [_speed_row(c, result.accuracy_flagged) for c in result.workloads]
    if result.config.reported_dev_speedup is not None:
        s = result.config.reported_dev_speedup
        rows.append({"workload": "dev (gate-reported)", "kind": "dev", "mode": "single", "speedup": s,
                     "speedup_min": s, "speedup_max": s, "timed_flag": False,
                     "accuracy_flag": result.accuracy_flagged})
    return pd.DataFrame(rows)


def min_samples(q: float) -> int:
    """Timings a q-percentile (q in (0, 50]) needs to be more than an interpolation between the extremes: at least
    one expected beyond it (n * q / 100 >= 1), so 4 for the 25-75 % interval and 10 for 10-90 %."""
    return math.ceil(100 / q - 1e-9)


def _tail(value: float, n: int, q: float) -> float | None:
    """A percentile's value, or None where its n timings cannot tell it (min_samples)."""
    return value if n >= min_samples(q) else None


def latency_frame(result: PostValResult) -> pd.DataFrame:
    """One row per single-request speed row and engine. The statistics are over every timed request of every
    repetition (`samples`; `requests` is per repetition); a percentile too few timings cannot tell is left empty."""
    import pandas as pd

    rows = []
    for c in result.speed:
        if c.mode != "single":
            continue
        for m in (c.vanilla, c.candidate):
            lat, ol = m.latency, m.output_lengths
            rows.append({"workload": c.workload, "engine": m.engine, "requests": c.requests,
                         "reps": len(m.tok_per_s.values), "samples": lat.n,
                         "latency_mean_s": lat.mean, "latency_median_s": lat.median,
                         "latency_p25_s": _tail(lat.p25, lat.n, 25), "latency_p75_s": _tail(lat.p75, lat.n, 25),
                         "latency_p10_s": _tail(lat.p10, lat.n, 10), "latency_p90_s": _tail(lat.p90, lat.n, 10),
                         "out_tokens_mean": ol.mean, "out_tokens_median": ol.median,
                         "out_tokens_p10": _tail(ol.p10, ol.n, 10), "out_tokens_p90": _tail(ol.p90, ol.n, 10),
                         "out_tokens_min": ol.min, "out_tokens_max": ol.max,
                         "length_capped_frac": ol.capped_frac, "timed_flag": c.timed_flagged,
                         "accuracy_flag": result.accuracy_flagged})
    return pd.DataFrame(rows)


# ---- markdown ------------------------------------------------------------------------------------------------

def accuracy_markdown(result: PostValResult) -> str:
    t = result.config.flag_points
    header = ["task", "items", "skipped (too long)", "vanilla %", "candidate %", "Δ points", "only candidate right",
              "only vanilla right", "identical outputs", "flag"]
    rows = [[a.task, a.items, a.skipped, _num(a.vanilla_acc), _num(a.candidate_acc), _num(a.delta_points, 1, True),
             a.candidate_only, a.vanilla_only, a.identical_outputs, f"{FLAG} outside ±{t:g}" if a.flagged else ""]
            for a in result.accuracy]
    out = [f"# Accuracy vs vanilla E0 (context {result.context_tokens} tokens)", "", accuracy_status(result), "",
           tables.markdown(header, rows)]
    if result.retrieval_buckets:
        b_rows = [[b.bucket, b.target_tokens, b.items, b.skipped, _num(b.vanilla_acc), _num(b.candidate_acc)]
                  for b in result.retrieval_buckets]
        out += ["", "## Retrieval by context length", "",
                tables.markdown(["bucket", "~tokens", "items", "skipped", "vanilla %", "candidate %"], b_rows)]
    return "\n".join(out) + "\n"


def _speed_md_rows(comps: list[SpeedComparison]) -> list[list[str]]:
    rows = []
    for c in comps:
        v, a = c.vanilla, c.candidate
        bound = "–" if v.bound_tok_per_s is None else f"{v.bound_tok_per_s:.1f} / {a.bound_tok_per_s:.1f}"
        energy = ("–" if v.energy_j_per_token is None or a.energy_j_per_token is None else
                  f"{v.energy_j_per_token.median:.3g} / {a.energy_j_per_token.median:.3g}")
        t = c.timed
        timed = "–" if t is None else (f"{t.valid_frac:.3f} / {t.identical_frac:.2f} / "
                                       f"{t.first_divergence_mean:.1f} / {t.length_ratio:.2f}")
        flag = []
        if c.timed_flagged:
            flag.append(f"{FLAG} not trustworthy: " + "; ".join(t.reasons))
        if not c.distinct_prompts:
            flag.append(f"{FLAG} prompts repeat within the process")
        if c.gpu_busy_passes:
            flag.append(f"{FLAG} not trustworthy: {c.gpu_busy_passes} passes began while the GPU still ran the "
                        f"other engine's work")
        requests = f"{c.requests}" if c.requests == c.requested or not c.requested else f"{c.requests} of {c.requested}"
        rows.append([c.workload, c.mode, requests, f"{c.prompt_len_mean:.0f}",
                     f"{v.output_lengths.mean:.0f} / {a.output_lengths.mean:.0f}", fmt_spread(v.tok_per_s),
                     fmt_spread(a.tok_per_s), fmt_spread(c.speedup, 2), bound, energy, timed, " ".join(flag)])
    return rows


SPEED_HEADER = ["workload", "mode", "requests / rep", "prompt tokens (mean)", "new tokens (mean, v / c)",
                "vanilla tok/s", "candidate tok/s", "speedup", "bound tok/s (v / c)", "J/token (v / c)",
                "timed outputs vs vanilla (valid / identical / 1st divergence / length)", "flag"]


def speed_markdown(result: PostValResult) -> str:
    n = result.config.reps
    speculation_note = "" if result.config.speculation else ", speculation off"
    out = [f"# Throughput vs vanilla E0{speculation_note}: median (min–max) of {n} interleaved repetitions", "",
           _status(result), "",
           "single = one request at a time (latency); batch = all requests in one generate call (throughput). "
           "Prefill included. Bound = memory-bandwidth bound for single-request decode. Fresh engine processes; "
           "each repetition times prompts its process has not seen; the other engine frozen meanwhile. Timed "
           "outputs: the fraction of the candidate's tokens that vanilla, scoring the candidate's own output, "
           "puts within the margin of its top-1 (valid), the fraction of outputs token-identical to vanilla's, the "
           "mean first differing token, summed length candidate / vanilla.", "",
           tables.markdown(SPEED_HEADER, _speed_md_rows(result.speed))]
    return "\n".join(out) + "\n"


def workload_markdown(result: PostValResult) -> str:
    rows = _speed_md_rows(result.workloads)
    if result.config.reported_dev_speedup is not None:
        rows.append(["dev (gate-reported)", "single", "", "", "", "", "", f"{result.config.reported_dev_speedup:.2f}",
                     "", "", "", ""])
    out = ["# Workload dependence: dev workloads next to held-out shapes (single request)", "",
           _status(result), "", tables.markdown(SPEED_HEADER, rows)]
    return "\n".join(out) + "\n"


def _interval(lo: float | None, hi: float | None, q: float, digits: int) -> str:
    """`lo–hi`, or why not: the interval's percentiles need min_samples(q) timings."""
    if lo is None or hi is None or lo != lo or hi != hi:  # None or NaN (the frame's empty cell)
        return f"– (under {min_samples(q)} timings)"
    return f"{lo:.{digits}f}–{hi:.{digits}f}"


def latency_markdown(result: PostValResult) -> str:
    header = ["workload", "engine", "timings", "mean s", "median s", "25–75 % s", "10–90 % s", "new tokens mean",
              "median", "10–90 %", "min–max", "hit max %", "flag"]
    rows = []
    for _, r in latency_frame(result).iterrows():
        rows.append([r.workload, r.engine, f"{r.samples} ({r.requests} × {r.reps} reps)", f"{r.latency_mean_s:.3f}",
                     f"{r.latency_median_s:.3f}", _interval(r.latency_p25_s, r.latency_p75_s, 25, 3),
                     _interval(r.latency_p10_s, r.latency_p90_s, 10, 3),
                     f"{r.out_tokens_mean:.1f}", f"{r.out_tokens_median:.0f}",
                     _interval(r.out_tokens_p10, r.out_tokens_p90, 10, 0), f"{r.out_tokens_min}–{r.out_tokens_max}",
                     f"{100 * r.length_capped_frac:.0f}", f"{FLAG} not trustworthy" if r.timed_flag else ""])
    out = ["# Single-request latency (every timed request of every repetition) and output lengths", "",
           _status(result), "", tables.markdown(header, rows)]
    return "\n".join(out) + "\n"


def write_tables(result: PostValResult, out_dir: str | Path) -> dict[str, str]:
    """accuracy / speed / latency / workload as .md and .parquet; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for name, frame, md in (("accuracy", accuracy_frame, accuracy_markdown), ("speed", speed_frame, speed_markdown),
                            ("latency", latency_frame, latency_markdown),
                            ("workload", workload_frame, workload_markdown)):
        (out / f"{name}.md").write_text(md(result), encoding="utf-8")
        frame(result).to_parquet(out / f"{name}.parquet", index=False)
        files[f"{name}.md"] = str(out / f"{name}.md")
        files[f"{name}.parquet"] = str(out / f"{name}.parquet")
    return files
