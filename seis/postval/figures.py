"""Figures (PNG, Agg backend): throughput with min–max ranges, latency intervals, accuracy vs vanilla,
workload dependence, and retained speedup along each chain of a run."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .result import PostValResult, SpeedComparison

if TYPE_CHECKING:
    import pandas as pd

COLORS = {"vanilla": "#7f7f7f", "candidate": "#1f77b4"}
FLAG_COLOR = "#d62728"


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    return plt


def _save(fig: Any, path: str | Path) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _plt().close(fig)
    return str(path)


def _bars(ax: Any, comps: list[SpeedComparison], title: str, show_bound: bool) -> None:
    """Paired bars (vanilla, candidate) per workload with min–max error bars and the speedup on top."""
    width = 0.38
    for i, c in enumerate(comps):
        for j, m in enumerate((c.vanilla, c.candidate)):
            x = i + (j - 0.5) * width
            s = m.tok_per_s
            ax.bar(x, s.median, width, color=COLORS[m.engine], label=m.engine if i == 0 else None)
            ax.errorbar(x, s.median, yerr=[[s.median - s.min], [s.max - s.median]], color="black", capsize=3)
            if show_bound and m.bound_tok_per_s:
                ax.plot([x - width / 2, x + width / 2], [m.bound_tok_per_s] * 2, color="black", ls="--", lw=1,
                        label="bandwidth bound" if i == 0 and j == 0 else None)
        top = max(c.candidate.tok_per_s.max, c.vanilla.tok_per_s.max)
        ax.annotate(f"×{c.speedup.median:.2f}" + (" ⚠" if c.timed_flagged else ""), (i, top), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points",
                    color=FLAG_COLOR if c.timed_flagged else "black")
    bounds = [m.bound_tok_per_s for c in comps for m in (c.vanilla, c.candidate) if m.bound_tok_per_s]
    tops = [m.tok_per_s.max for c in comps for m in (c.vanilla, c.candidate)]
    if show_bound and bounds and max(bounds) > 5 * max(tops):  # far-off bound: keep the bars readable
        ax.set_yscale("log")
    else:
        ax.margins(y=0.3)  # room for the speedup labels and the legend above the bars
    ax.set_xticks(range(len(comps)), [c.workload for c in comps], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tokens / s")
    ax.set_title(title, fontsize=10)
    if comps:
        log = ax.get_yscale() == "log"
        ax.legend(fontsize=8, loc="center right" if log else "upper left", ncols=1 if log else 3)


def plot_throughput(result: PostValResult, path: str | Path) -> str:
    plt = _plt()
    modes = [m for m in ("single", "batch") if any(c.mode == m for c in result.speed)] or ["single"]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        comps = [c for c in result.speed if c.mode == mode]
        label = "one request at a time" if mode == "single" else "all requests in one batch"
        _bars(ax, comps, f"{mode}: {label} (median, min–max)", show_bound=mode == "single")
    _flag_title(fig, result)
    return _save(fig, path)


def plot_latency(result: PostValResult, path: str | Path) -> str:
    plt = _plt()
    rows = [(c.workload, m) for c in result.speed if c.mode == "single" for m in (c.vanilla, c.candidate)]
    fig, ax = plt.subplots(figsize=(7, 1 + 0.5 * max(len(rows), 1)))
    for y, (_, m) in enumerate(rows):
        lat = m.latency
        ax.plot([lat.p10, lat.p90], [y, y], color=COLORS[m.engine], lw=1.5)
        ax.plot([lat.p25, lat.p75], [y, y], color=COLORS[m.engine], lw=6, solid_capstyle="butt")
        ax.plot(lat.median, y, "o", color="white", mec="black", zorder=3)
        ax.plot(lat.mean, y, "x", color="black", zorder=3)
    ax.set_yticks(range(len(rows)), [f"{w} · {m.engine}" for w, m in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per request (thick 25–75 %, thin 10–90 %, o median, x mean)")
    ax.set_title("Single-request latency", fontsize=10)
    _flag_title(fig, result)
    return _save(fig, path)


def plot_accuracy(result: PostValResult, path: str | Path) -> str:
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for i, a in enumerate(result.accuracy):
        for j, (name, acc) in enumerate((("vanilla", a.vanilla_acc), ("candidate", a.candidate_acc))):
            ax.bar(i + (j - 0.5) * width, acc or 0.0, width, color=COLORS[name], label=name if i == 0 else None)
        if a.delta_points is not None:
            top = max(a.vanilla_acc or 0.0, a.candidate_acc or 0.0)
            ax.annotate(f"{a.delta_points:+.1f} pts" + (" ⚠" if a.flagged else ""), (i, top), ha="center",
                        va="bottom", xytext=(0, 3), textcoords="offset points", fontsize=9,
                        color=FLAG_COLOR if a.flagged else "black")
    ax.set_xticks(range(len(result.accuracy)), [f"{a.task}\n(n={a.items})" for a in result.accuracy])
    ax.set_ylabel("accuracy %")
    ax.set_ylim(0, 105)
    ax.set_title(f"Accuracy vs vanilla (flag beyond ±{result.config.flag_points:g} pts)", fontsize=10)
    if result.accuracy:
        ax.legend(fontsize=8)
    buckets = [b for b in result.retrieval_buckets if b.items]
    for name, style, size in (("vanilla", "s--", 9), ("candidate", "o-", 5)):  # vanilla drawn larger: both show
        ax2.plot([b.target_tokens for b in buckets], [getattr(b, f"{name}_acc") for b in buckets], style,
                 color=COLORS[name], label=name, ms=size)
    ax2.set_xscale("log")
    ax2.minorticks_off()  # label only the buckets' own lengths
    ax2.set_xticks([b.target_tokens for b in buckets], [str(b.target_tokens) for b in buckets], fontsize=8,
                   rotation=45)
    ax2.set_xlabel("retrieval context (~tokens)")
    ax2.set_ylabel("accuracy %")
    ax2.set_ylim(-5, 105)
    skipped = sum(b.skipped for b in result.retrieval_buckets)
    ax2.set_title(f"Retrieval by context length ({skipped} items skipped: too long)", fontsize=10)
    if buckets:
        ax2.legend(fontsize=8)
    return _save(fig, path)


def plot_workload(result: PostValResult, path: str | Path) -> str:
    """Throughput per workload shape, speedup per shape against the dev speedup, tok/s by output length."""
    plt = _plt()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4))
    comps = result.workloads
    _bars(ax1, comps, "single request, dev and held-out shapes", show_bound=True)
    xs = range(len(comps))
    ax2.bar(xs, [c.speedup.median for c in comps], color=["#2ca02c" if c.kind == "dev" else "#9467bd" for c in comps])
    ax2.errorbar(xs, [c.speedup.median for c in comps],
                 yerr=[[c.speedup.median - c.speedup.min for c in comps],
                       [c.speedup.max - c.speedup.median for c in comps]], fmt="none", color="black", capsize=3)
    ax2.axhline(1.0, color="black", lw=0.8)
    dev = next((c for c in comps if c.workload == "dev-natural"), None)
    if dev is not None:
        ax2.axhline(dev.speedup.median, color="#2ca02c", ls="--", lw=1, label=f"dev speedup ×{dev.speedup.median:.2f}")
    if result.config.reported_dev_speedup is not None:
        ax2.axhline(result.config.reported_dev_speedup, color="#ff7f0e", ls=":", lw=1,
                    label=f"gate-reported dev ×{result.config.reported_dev_speedup:.2f}")
    ax2.set_xticks(list(xs), [c.workload for c in comps], rotation=20, ha="right", fontsize=8)
    ax2.set_ylabel("speedup vs vanilla")
    ax2.set_title("Speedup: held-out shapes next to dev", fontsize=10)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=8)
    # Per-request throughput against output length (natural-length single requests, every repetition).
    for c in (c for c in result.speed if c.mode == "single" and not c.ignore_eos):
        for m in (c.vanilla, c.candidate):
            pts = [(n, n / s) for n, s in zip(m.request_new_tokens, m.request_latency_s, strict=True)
                   if s > 0]
            if pts:
                ax3.scatter(*zip(*pts, strict=True), s=10, alpha=0.6, color=COLORS[m.engine], label=m.engine)
    ax3.set_xlabel("new tokens of the request")
    ax3.set_ylabel("tokens / s (request)")
    ax3.set_title("Natural length: throughput by output length", fontsize=10)
    if ax3.get_legend_handles_labels()[0]:
        ax3.legend(fontsize=8)
    _flag_title(fig, result)
    return _save(fig, path)


def _flag_title(fig: Any, result: PostValResult) -> None:
    parts = []
    if result.accuracy_flagged:
        parts.append(f"⚠ accuracy differs from vanilla beyond ±{result.config.flag_points:g} points")
    if result.timed_flagged:
        parts.append("⚠ timed outputs differ from vanilla's (⚠ rows): those speed figures are not trustworthy")
    if parts:
        fig.suptitle("; ".join(parts), color=FLAG_COLOR, fontsize=10)


def write_figures(result: PostValResult, out_dir: str | Path) -> dict[str, str]:
    out = Path(out_dir)
    return {f"{name}.png": fn(result, out / f"{name}.png")
            for name, fn in (("throughput", plot_throughput), ("latency", plot_latency),
                             ("accuracy", plot_accuracy), ("workload", plot_workload))}


def plot_chain_speedups(summary_df: pd.DataFrame, path: str | Path) -> str:
    """Retained dev speedup vs vanilla along each chain.

    summary_df columns: chain, session (index along the chain), retained (bool), dev_speedup_vs_vanilla,
    synced_from (None, or the chain — optionally "chain/session" — whose materials a sync brought in).
    Retained sessions form each chain's line; rejected ones are faint crosses; syncs get a dashed arrow from
    the source point when it can be found, else a labelled diamond.
    """
    plt = _plt()
    need = {"chain", "session", "retained", "dev_speedup_vs_vanilla", "synced_from"}
    missing = need - set(summary_df.columns)
    if missing:
        raise ValueError(f"summary_df lacks columns {sorted(missing)}")
    df = summary_df.sort_values(["chain", "session"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    cmap = plt.get_cmap("tab10")
    chains = list(dict.fromkeys(df["chain"]))
    points: dict[tuple[str, str], tuple[float, float]] = {}
    for k, chain in enumerate(chains):
        rows = df[df["chain"] == chain]
        color = cmap(k % 10)
        kept = rows[rows["retained"].astype(bool)]
        rejected = rows[~rows["retained"].astype(bool)]
        ax.plot(kept["session"], kept["dev_speedup_vs_vanilla"], "o-", color=color, label=str(chain))
        ax.plot(rejected["session"], rejected["dev_speedup_vs_vanilla"], "x", color=color, alpha=0.35)
        for _, r in kept.iterrows():
            points[(str(chain), str(r["session"]))] = (r["session"], r["dev_speedup_vs_vanilla"])
    for _, r in df[df["synced_from"].notna() & df["retained"].astype(bool)].iterrows():
        dst = (r["session"], r["dev_speedup_vs_vanilla"])
        src = _sync_source(str(r["synced_from"]), r["session"], df, points)
        if src is not None:
            ax.annotate("", dst, src, arrowprops={"arrowstyle": "->", "ls": "--", "color": "black", "lw": 0.8})
        else:
            ax.plot(*dst, "D", mfc="none", mec="black")
            ax.annotate(f"← {r['synced_from']}", dst, xytext=(4, 4), textcoords="offset points", fontsize=7)
    ax.axhline(1.0, color="black", lw=0.8)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # sessions are counted, not measured
    ax.set_xlabel("session")
    ax.set_ylabel("dev speedup vs vanilla (retained)")
    ax.set_title("Retained speedup along each chain (x: rejected, dashed: sync)", fontsize=10)
    if chains:
        ax.legend(fontsize=8, title="chain")
    return _save(fig, path)


def _sync_source(ref: str, session: Any, df: pd.DataFrame,
                 points: dict[tuple[str, str], tuple[float, float]]) -> tuple[float, float] | None:
    """'chain/session' or 'chain:session' names a point; a bare chain means its latest retained one before."""
    for sep in ("/", ":"):
        if sep in ref:
            chain, sess = ref.rsplit(sep, 1)
            return points.get((chain, sess))
    earlier = [(k, v) for k, v in points.items() if k[0] == ref and _le(v[0], session)]
    return max(earlier, key=lambda kv: kv[1][0])[1] if earlier else None


def _le(a: Any, b: Any) -> bool:
    try:
        return a <= b
    except TypeError:
        return False


def plot_gate_timeline(spans: list, path: str | Path) -> str:
    """One lane per worker and device, one bar per gate (seconds from the run's first), labelled chain/session;
    a failed gate's bar is red. spans: seis.session.timeline.GateSpan."""
    plt = _plt()
    lanes = sorted({s.lane for s in spans})
    t0 = min((s.start for s in spans), default=None)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * max(1, len(lanes))))
    cmap = plt.get_cmap("tab10")
    chains = sorted({s.chain for s in spans})
    for s in spans:
        y, left = lanes.index(s.lane), (s.start - t0).total_seconds()
        width = (s.end - s.start).total_seconds()
        color = FLAG_COLOR if s.verdict == "fail" else cmap(chains.index(s.chain) % 10)
        ax.barh(y, width, left=left, height=0.6, color=color, edgecolor="black", lw=0.5)
        ax.text(left + width / 2, y, f"{s.chain}/s{s.session}", ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the first gate's start")
    ax.set_title("Gates by worker and device (colour: chain; red: failed)", fontsize=10)
    return _save(fig, path)
