"""What a run says while it runs and how it ends: one line per finished session (its speedups, whether they are
within noise, the best engine so far), the noise rule the best-engine pick uses, and whether a run that finished
every session still failed (nothing in it was judged). Nothing here imports Prefect."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .lineage import pick_best
from .spec import SessionOutcome

BASELINES = ("parent", "vanilla")


def within_noise(candidate, baseline) -> bool:
    """Whether a speedup is within noise: the candidate's tok/s range over the gate's repetitions (min..max of the
    per-repetition tok/s, SpeedStat) overlaps the baseline engine's range in the same gate, on a workload the
    session's speedups come from (ranked_workloads). The gate times at least three interleaved
    repetitions; if the slowest pass of one engine is faster than the fastest pass of the other, the gap is
    bigger than anything this gate saw the machine do to the same engine, and the speedup counts. Otherwise it
    is within noise, whatever the median ratio says. Conservative by design: on a quiet machine ranges are
    narrow and a few percent show; on a busy CPU a large ratio can be noise (the same tree scored 0.47x-1.47x).
    Not a test of significance: a gate whose repetitions all drifted alike can still mislead. No measurement
    (either side None): False, there is no speedup to call noise."""
    if candidate is None or baseline is None:
        return False
    return candidate.min <= baseline.max and baseline.min <= candidate.max


@dataclass(frozen=True)
class GainNoise:
    """Whether a session's dev speedups (vs its parent, vs vanilla) are within noise; False when not measured."""
    vs_parent: bool = False
    vs_vanilla: bool = False


def ranked_workloads(speed, objective: str = "none") -> list[str]:
    """The dev workloads a session's speedups come from, by the run's objective (seis.session.objective): the
    natural-length one timed one request at a time (single, and none, whose timings judge nothing but still rank),
    the batched one (throughput), or both (both). A table without the objective's batched workload (the gate timed
    none): the one-at-a-time one."""
    if speed is None:
        return []
    timed = {r.workload for r in speed.rows if r.engine == "candidate"}
    single = [w.name for w in speed.workloads if w.batch == 1 and w.name in timed]
    natural = next((n for n in single if "natural" in n), single[0] if single else None)
    batched = [w.name for w in speed.workloads if w.batch > 1 and w.name in timed]
    chosen = {"throughput": batched, "both": [natural, *batched]}.get(objective, [natural])
    return [n for n in chosen if n is not None] or ([natural] if natural else [])


def _engine_rows(speed, objective: str) -> list[dict]:
    """engine -> SpeedRow, one dict per ranked workload."""
    names = ranked_workloads(speed, objective)
    return [{r.engine: r for r in speed.rows if r.workload == name} for name in names]


def dev_speedups(speed, objective: str = "none") -> tuple[float | None, float | None]:
    """(vs vanilla, vs parent) of the candidate: its ratio on the ranked workload, the geometric mean of its ratios
    where the objective ranks several (both: one request at a time and batched), None where any is missing."""
    rows = [r["candidate"] for r in _engine_rows(speed, objective) if "candidate" in r]
    return (_geometric_mean([r.vs_vanilla for r in rows]), _geometric_mean([r.vs_parent for r in rows]))


def _geometric_mean(ratios: list[float | None]) -> float | None:
    if not ratios or any(r is None or r <= 0 for r in ratios):
        return None
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def gain_noise(speed, objective: str = "none") -> GainNoise:
    """GainNoise from a gate's speed table (SpeedTable, or None: not measured): within noise against a baseline
    when it is so on every ranked workload (no gain or loss shown on any)."""
    noisy = {b: [] for b in BASELINES}
    for rows in _engine_rows(speed, objective):
        cand = rows.get("candidate")
        if cand is None or cand.tok_per_s is None:
            return GainNoise()
        for b in BASELINES:
            noisy[b].append(within_noise(cand.tok_per_s, rows[b].tok_per_s if b in rows else None))
    return GainNoise(*(bool(noisy[b]) and all(noisy[b]) for b in BASELINES))


def session_gain_noise(session_dir: Path, objective: str = "none") -> GainNoise:
    """GainNoise of a recorded session: from its gate.json, or the speed table of the verdict it reused as
    gate-reused.json recorded it (older records: the gated session's gate.json). No gate recorded: not
    measured."""
    from ..evaluator.schema import SpeedTable
    from .reuse import reused_from, reused_speed
    from .rundir import run_root_of

    gate_file = Path(session_dir) / "gate.json"
    try:
        if gate_file.is_file():
            speed = json.loads(gate_file.read_text()).get("speed")
        else:
            recorded, speed = reused_speed(session_dir)
            reused, root = reused_from(session_dir), run_root_of(session_dir)
            if not recorded and reused and root is not None:
                speed = json.loads((root / reused / "gate.json").read_text()).get("speed")
        return gain_noise(SpeedTable.model_validate(speed) if speed else None, objective)
    except (OSError, ValueError, AttributeError):
        return GainNoise()


def noisy_sessions(outcomes: list[SessionOutcome], noise: dict[tuple[str, int], GainNoise]) -> set[tuple[str, int]]:
    """The (chain, session) whose gain over vanilla is within noise: what pick_best ranks as 1.0x."""
    return {(o.chain, o.session) for o in outcomes if noise.get((o.chain, o.session), GainNoise()).vs_vanilla}


def run_noise(root: Path, outcomes: list[SessionOutcome], objective: str = "none"
              ) -> dict[tuple[str, int], GainNoise]:
    """GainNoise of each recorded session of a run directory."""
    from .rundir import RunDir
    run = RunDir(Path(root))
    return {(o.chain, o.session): session_gain_noise(run.session_dir(o.chain, o.session), objective)
            for o in outcomes}


def pick_best_of_run(root: Path, outcomes: list[SessionOutcome], objective: str = "none"
                     ) -> tuple[SessionOutcome | None, bool]:
    """The run's best engine (lineage.pick_best, a gain within noise ranked as 1.0x) and whether its own gain over
    vanilla is within noise."""
    noisy = noisy_sessions(outcomes, run_noise(root, outcomes, objective))
    best = pick_best(outcomes, noisy)
    return best, best is not None and (best.chain, best.session) in noisy


def best_record(best: SessionOutcome | None, best_within_noise: bool) -> dict | None:
    """What best.json holds: the best engine's summary row, and whether its gain over vanilla is within noise."""
    return None if best is None else {**best.summary_row(), "dev_speedup_within_noise": best_within_noise}


# ---- the session line --------------------------------------------------------------------------------------------
def speedup_text(value: float | None, noisy: bool) -> str:
    """`1.52x`, `1.04x (within noise)`, or `-` (not gated)."""
    if value is None:
        return "-"
    return f"{value:.2f}x" + (" (within noise)" if noisy else "")


def session_line(outcome: SessionOutcome, notes: str, noise: GainNoise = GainNoise(),
                 best: SessionOutcome | None = None, best_within_noise: bool = False) -> str:
    """`[c1 s2] <notes> -> pass, retained (2f07be636240d250); vs parent 1.04x (within noise), vs vanilla 1.52x;
    best so far 1.52x (c1/s2)`."""
    from ..tables import printable
    from .display import run_label
    status = "retained" if outcome.retained else "kept parent"
    notes = printable(notes, multiline=False)  # an agent's end reason or a file name it left: shown, never obeyed
    best_text = "none retained" if best is None else \
        f"{speedup_text(best.dev_speedup_vs_vanilla, best_within_noise)} ({run_label(best.chain, best.session)})"
    return (f"[{outcome.chain} s{outcome.session}] {notes} -> {outcome.verdict}, {status} ({outcome.snapshot}); "
            f"vs parent {speedup_text(outcome.dev_speedup_vs_parent, noise.vs_parent)}, "
            f"vs vanilla {speedup_text(outcome.dev_speedup_vs_vanilla, noise.vs_vanilla)}; best so far {best_text}")


def progress_line(session_dir: Path, notes: str, outcome: SessionOutcome, objective: str = "none") -> str:
    """The session line of a session just recorded in its run directory; the best so far is picked, as best.json
    will be, from every outcome the run directory holds now (a resumed run's stale ones are set aside as it starts)."""
    from .resume import recorded_outcomes
    from .rundir import run_root_of

    noise = session_gain_noise(session_dir, objective)
    root = run_root_of(session_dir)
    if root is None:
        return session_line(outcome, notes, noise)
    best, best_noisy = pick_best_of_run(root, recorded_outcomes(root), objective)
    return session_line(outcome, notes, noise, best, best_noisy)


# ---- how a run ends ------------------------------------------------------------------------------------------------
def _one_line(text: str, limit: int = 200) -> str:
    """One line of printable characters (a reason can quote an agent, an engine or a file name)."""
    from ..tables import printable
    text = printable(" ".join(text.split()), multiline=False)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_failure(outcomes: list[SessionOutcome]) -> str | None:
    """Why a run whose sessions all finished still failed, in one line; None when it did not.

    It failed when no session reached a gate verdict (pass or fail) and at least one errored (verdict "error": no
    gate ran for a reason other than the agent changing nothing: the agent failed, the gate refused the tree,
    the device could not be used). Sessions whose agent changed nothing ("no_change") are not errors: a run of
    only those (an offline library with nothing left to try) completes, since nothing broke and the summary
    says there was nothing to do; but beside errors they do not make the run a success. One verdict, pass or
    fail, means the machinery judged something: the run completes and the summary tells the rest."""
    if not outcomes or any(o.verdict in ("pass", "fail") for o in outcomes):
        return None
    errors = [o for o in outcomes if o.verdict == "error"]
    if not errors:
        return None
    from .display import run_label
    first = errors[0]
    why = _one_line(f"{run_label(first.chain, first.session)}: {'; '.join(first.reasons) or 'no reason recorded'}")
    if len(errors) == len(outcomes):
        return f"every session errored ({len(errors)} of {len(outcomes)}), nothing was judged; first: {why}"
    return (f"no session reached a verdict: {len(errors)} of {len(outcomes)} errored, the others changed nothing; "
            f"first: {why}")
