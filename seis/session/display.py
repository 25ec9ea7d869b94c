"""How a run shows itself in an orchestrator's UI: run names and tags with chain and session, stable artifact keys,
and the artifacts' markdown (gate tables in code fences, rounded numbers). Nothing here imports Prefect."""
from __future__ import annotations

import re
from pathlib import Path

from .. import tables
from .spec import SessionOutcome

ROUNDING = {"dev_speedup_vs_vanilla": 3, "dev_speedup_vs_parent": 3, "wall_s": 1, "cost_usd": 4}


def run_label(chain: str, session: int) -> str:
    """`c0/s1`: the prefix of every task run name of one session."""
    return f"{chain}/s{session}"


def run_tags(chain: str | None = None, session: int | None = None) -> tuple[str, ...]:
    """`chain:c0`, `session:1`: tags to filter a session's (or a fan-in's) task runs by."""
    return tuple([f"chain:{chain}"] * (chain is not None) + [f"session:{session}"] * (session is not None))


def artifact_key(*parts: object) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from the non-empty parts: `seis-session-c0-s1`."""
    text = "-".join(str(p) for p in parts if p not in (None, ""))
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower())).strip("-")


def stable_prefix(flow_name: str | None, deployment_name: str | None) -> str:
    """`seis` for a local run, `seis-sync-chain` for a run of deployment seis/sync-chain: the same key every run,
    so the UI's per-key history compares runs of one deployment."""
    return artifact_key(flow_name or "seis", deployment_name)


def rounded(row: dict) -> dict:
    """A summary row for display (the table artifact): speedups to 3 decimals, wall seconds to 1, text one line of
    printable characters (a reason or change name can quote an agent or an engine)."""
    return {k: (round(v, ROUNDING[k]) if k in ROUNDING and isinstance(v, float)
                else tables.printable(v, multiline=False) if isinstance(v, str) else v) for k, v in row.items()}


def fence(text: str, lang: str = "text") -> str:
    """Text in a code fence (longer than any backtick run inside it), so tables keep their columns."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.strip(chr(10))}\n{ticks}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def session_markdown(outcome: SessionOutcome, measurements: str, session_dir: Path) -> str:
    """The session artifact: the facts (table cells: tables.md_cell), the agent's report and the gate's
    measurements, each as text in a code fence it cannot close: an orchestrator's UI shows the agent's words but
    renders none of them (no HTML, link, image, heading, table row or verdict line of the agent's making, no control
    character: tables.printable)."""
    from ..agents.report import split_report
    status = "retained" if outcome.retained else "rejected, the chain keeps its parent"
    facts = [
        ("verdict", f"{outcome.verdict} ({status})"),
        ("parent -> engine", f"`{outcome.parent_snapshot}` -> `{outcome.snapshot}`"),
        ("dev speedup vs vanilla", _x(outcome.dev_speedup_vs_vanilla)),
        ("dev speedup vs parent", _x(outcome.dev_speedup_vs_parent)),
        ("applied", ", ".join(outcome.applied) or "-"), ("adopted", ", ".join(outcome.adopted) or "-"),
        ("synced from", ", ".join(outcome.synced_from) or "-"),
        ("reasons", "; ".join(outcome.reasons) or "-"),
        ("agent", f"{outcome.agent}: {outcome.tokens_in} tokens in, {outcome.tokens_out} out, "
                  f"${outcome.cost_usd:.4f}"),
        ("wall", f"{outcome.wall_s:.1f} s"), ("files", f"`{session_dir}`"),
    ]
    lines = [f"# {run_label(outcome.chain, outcome.session)}: {outcome.verdict}", "",
             tables.markdown(("", ""), facts), ""]
    agent, table = split_report(outcome.report.markdown)  # table: the gate's part of report.md, when laid out so
    lines += ["## Report", "", "The agent's report as it wrote it, shown as text:", "",
              fence(tables.printable(agent), "markdown")]
    gate = (table or measurements).strip()
    if gate:
        lines += ["", "## Gate", "", fence(tables.printable(gate))]
    return "\n".join(lines) + "\n"


def postval_flags_line(snapshot: str, flags: list[str], postval_dir: Path) -> str:
    """One line naming what the post-validation of the best engine flagged ('' when nothing): said where the run
    names its best engine (its log, status.json's message, the summary artifact), not only in postval/."""
    if not flags:
        return ""
    return tables.printable(f"post-validation flagged the best engine {snapshot}: {'; '.join(flags)} "
                            f"(see {postval_dir})", multiline=False)


def summary_artifact_markdown(run_id: str, protocol: str, run_root: Path, summary_md: str, figure: Path | None,
                              best: SessionOutcome | None, best_within_noise: bool = False,
                              failure: str | None = None, flagged: str = "") -> str:
    """The run's summary artifact: what ran (and why it failed, when it did), the best retained engine, the chain
    figure and the summary table."""
    noise = " (within noise: no gain shown beyond its gate's noise)" if best_within_noise else ""
    best_line = (f"Best retained engine: `{best.snapshot}` ({run_label(best.chain, best.session)}, dev speedup vs "
                 f"vanilla {_x(best.dev_speedup_vs_vanilla)}{noise})" if best else "No engine was retained.")
    if flagged:
        best_line += f"\n\n**Post-validation flagged it:**\n\n{fence(flagged)}"
    if failure:  # it can quote what an agent or an engine said: text in a fence
        best_line = f"**Run failed:**\n\n{fence(tables.printable(failure))}\n\n{best_line}"
    return "\n".join([
        f"# SEIS {protocol} run `{run_id}`", "", best_line, "",
        f"Chain figure: `{figure}`" if figure else "Chain figure: none", "",
        f"Run directory: `{run_root}` (summary.parquet, summary.md, best.json, chains/)", "",
        summary_md.strip("\n"), ""])
