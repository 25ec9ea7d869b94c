"""Plain-text rendering of gate results and speed tables (for terminals and report.md)."""
from __future__ import annotations

from .. import tables
from ..engine_host.attention import baseline_attention
from .schema import CheckResult, DevBenchmarkResult, GateResult, SpeedStat, SpeedTable


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}"


def _range(s: SpeedStat | None, digits: int = 1) -> str:
    return "failed" if s is None else f"{s.median:.{digits}f} ({s.min:.{digits}f}–{s.max:.{digits}f})"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def _cell(text: str, limit: int = 110) -> str:
    """One line of at most `limit` characters: a detail or error can quote what a candidate engine raised, and
    an engine must not be able to write lines (forged headings, verdicts) into a report."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in str(text)).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return tables.plain(header, rows).splitlines()


def render_checks(checks: list[CheckResult]) -> list[str]:
    rows = [["ok" if c.passed and not c.skipped else "skip" if c.skipped else "FAIL", c.name, _num(c.value),
             c.threshold, _cell(c.detail)] for c in checks]
    return _table(["", "check", "value", "threshold", "detail"], rows)


def render_speed(table: SpeedTable, engine_words: bool = True) -> list[str]:
    """engine_words=False: a row's error is not quoted (see render_gate_for_agents), only that it has one."""
    rows = [[r.workload, r.engine, f"{r.tokens_per_pass:.0f}", _range(r.tok_per_s), _range(r.latency_ms),
             _ratio(r.vs_parent), _ratio(r.vs_vanilla)] for r in table.rows]
    lines = [f"Speed on {table.device}: dev workloads, one request at a time and batched, median (min–max) of "
             f"{table.reps} interleaved repetitions"]
    lines += _table(["workload", "engine", "tokens", "tok/s", "latency ms", "vs parent", "vs vanilla"], rows)
    lines += [f"  {w.name}: {w.n_prompts} prompts, "
              + (f"all {w.batch} in one batch (serving throughput), " if w.batch > 1 else "one at a time, ")
              + f"max_new_tokens {w.max_new_tokens}, {'ignore_eos' if w.ignore_eos else 'EOS on'}"
              for w in table.workloads]
    errors = [f"  {r.engine} on {r.workload}: "
              + (_cell(r.error, 300) if engine_words else f"failed ({ENGINE_WORDS_KEPT})") for r in table.rows if r.error]
    return lines + errors


def render_gate(result: GateResult) -> str:
    iso = result.isolation
    lines = [
        f"SEIS gate: candidate {result.candidate} (tree {result.hashes.candidate_tree[:12]}) vs reference "
        f"{result.reference} (tree {result.hashes.reference_tree[:12]})",
        f"model {result.model} on {result.device}; wall {result.wall_s:.1f} s; sandbox: {iso.sandbox}; "
        f"memory {iso.memory_limit}",
        baseline_attention(result.engine_stats.get("vanilla", {}), result.device)
        or "vanilla E0's attention backend: unknown",
        "",
        "Correctness (candidate vs reference):",
        *render_checks(result.checks),
    ]
    if result.calibration:
        cal = result.calibration
        lines += ["", f"Calibration ({cal.requests} requests, {cal.positions} forced positions): "
                  + ", ".join(f"{k} noise {cal.noise.get(k, float('nan')):.3g} -> tol {cal.tolerance[k]:.3g}"
                             for k in cal.tolerance)]
    if result.speed:
        lines += ["", *render_speed(result.speed)]
    lines.append("")
    if result.verdict == "pass":
        lines.append(f"VERDICT: PASS ({len(result.checks)} checks passed)")
    else:
        lines.append(f"VERDICT: FAIL ({len(result.failed_checks)} of {len(result.checks)} checks failed)")
        for c in result.checks:
            if not c.passed:
                lines.append(f"  {c.name}: value {_num(c.value)}, threshold {c.threshold} — {_cell(c.detail, 300)}")
    return "\n".join(lines)


def render_dev_benchmark(result: DevBenchmarkResult) -> str:
    lines = [f"Dev benchmark: candidate tree {result.candidate_tree[:12]}, model {result.model}, "
             f"wall {result.wall_s:.1f} s", *render_speed(result.speed)]
    return "\n".join(lines + [f"error: {_cell(e, 300)}" for e in result.errors])


# Checks on prompts agents may see and benchmark themselves; everything else (held-out prompts, EOS probes,
# long contexts, the calibration) stays out of what agents read.
AGENT_VISIBLE_PREFIXES = ("engine.", "dev.", "timed.")
# Nor do an engine's own words after its build: its error replies, its stderr and its unreadable lines, which
# engine.errors and the speed rows quote. By then the candidate has answered the held-out requests (the mixed batch
# is its second call), so a candidate that fails on purpose could quote them to the next session's agent. Agents
# learn how many calls of which kind failed; gate.json keeps the words for the operator.
ENGINE_WORDS_KEPT = "the engine's messages are kept in gate.json, not shown to agents"


def _agent_detail(c: CheckResult) -> str:
    if c.name != "engine.errors" or c.passed:
        return c.detail
    ops = ", ".join(f"{k.removeprefix('failed.')} x{v:g}" for k, v in c.extra.items() if k.startswith("failed."))
    return f"{c.value:g} failed call(s){f' ({ops})' if ops else ''}; {ENGINE_WORDS_KEPT}"


def render_gate_for_agents(result: GateResult) -> str:
    """The verdict, the dev checks (no thresholds) and the dev speed table: what goes into report.md, which later
    sessions' agents read. gate.json, outside every workspace, keeps the rest."""
    shown = [c for c in result.checks if c.name.startswith(AGENT_VISIBLE_PREFIXES)]
    hidden_failed = [c for c in result.checks if not c.passed and not c.name.startswith(AGENT_VISIBLE_PREFIXES)]
    rows = [["ok" if c.passed else "FAIL", c.name, _cell(_agent_detail(c))] for c in shown]
    lines = [f"Gate verdict: {result.verdict.upper()} (candidate tree {result.hashes.candidate_tree[:12]}, "
             f"model {result.model} on {result.device})", "", "Dev checks:", *_table(["", "check", "detail"], rows)]
    if hidden_failed:
        lines += ["", f"{len(hidden_failed)} held-out check(s) failed as well (details are not shown to agents)."]
    if result.speed:
        lines += ["", *render_speed(result.speed, engine_words=False)]
    return "\n".join(lines)
