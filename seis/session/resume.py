"""What a run directory says is finished, so that a resumed run redoes only what is not.

A session is finished when its directory holds `outcome.json` (written last, atomically, by `record`), its
`report.md`, and, when it was retained, its snapshot is in the store. Anything else in a session directory is
the remains of an interrupted session: it is removed and the session is redone from its parent. A recorded
session is kept only if it still follows from what comes before it (same parent engine; no earlier session it
depends on was redone), so a resumed run is the run that would have happened.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..files import write_atomic
from ..workspace.tree import remove_tree
from .rundir import OUTCOME_FILE, RunDir, run_root_of
from .spec import SessionOutcome
from .status import count_sessions_done


def save_outcome(session_dir: Path, outcome: SessionOutcome) -> Path:
    """Record the outcome (atomically), then count it in the run's status.json (`sessions_done`, under the status
    lock: sessions finishing at once in parallel chains each count)."""
    path = session_dir / OUTCOME_FILE
    write_atomic(path, json.dumps(outcome.to_dict(), indent=2, default=str) + "\n")
    root = run_root_of(session_dir)
    if root is not None:
        count_sessions_done(root, RunDir(root).sessions_recorded)
    return path


STALE_OUTCOME_FILE = "outcome.stale.json"   # an outcome a resume does not keep (its session is redone)


def keep_only(root: Path, kept: set[tuple[str, int]]) -> None:
    """A resume, before any session runs: every recorded outcome but `kept` (chain, session) is set aside as
    outcome.stale.json (not deleted: the session's files stay, for a reader, until its redo clears them), then
    sessions_done is counted again. A stale outcome left as outcome.json would count as done until its round
    came, show as the best so far, and be kept by the next resume if this one were interrupted first. The
    recount also corrects a count that a crash between an outcome's write and its count left behind."""
    for path in sorted((Path(root) / "chains").glob(f"*/*/{OUTCOME_FILE}")):
        chain, session = path.parent.parent.name, path.parent.name
        if not (session.isdigit() and (chain, int(session)) in kept):
            path.replace(path.with_name(STALE_OUTCOME_FILE))
    count_sessions_done(root, RunDir(root).sessions_recorded)


def recorded_outcomes(root: Path) -> list[SessionOutcome]:
    """Every outcome recorded in a run directory so far, in session then chain order (a resumed run's stale ones
    are set aside as it starts: keep_only)."""
    outcomes = [o for o in (load_outcome(p.parent) for p in (Path(root) / "chains").glob(f"*/*/{OUTCOME_FILE}"))
                if o is not None]
    return sorted(outcomes, key=lambda o: (o.session, len(o.chain), o.chain))  # c2 before c10


def load_outcome(session_dir: Path) -> SessionOutcome | None:
    """The recorded outcome, or None when there is none (or it cannot be read: then it is not finished)."""
    try:
        return SessionOutcome.from_dict(json.loads((session_dir / OUTCOME_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def finished(session_dir: Path, store) -> SessionOutcome | None:
    """The session's outcome if it finished: outcome and report recorded, and a retained engine in the store."""
    outcome = load_outcome(session_dir)
    if outcome is None or not (session_dir / "report.md").is_file():
        return None
    if outcome.retained and outcome.snapshot not in store:
        return None
    return outcome


def missing_snapshots(root: Path, store_root: Path, outcomes_too: bool = True) -> list[str]:
    """The engines this run recorded that its store does not hold, as `what id` (vanilla first, then each recorded
    session's): vanilla.json's snapshot and, with `outcomes_too`, every recorded session's engine. A session is
    snapshotted before its outcome is written, so such a gap means the store was lost (moved, emptied, a mount
    that is not up), not that the session was cut off; a resume would take those sessions for unfinished and
    delete what they recorded. Nothing is made or written in the store."""
    from ..store import SnapshotStore
    wanted = []
    if (vanilla := RunDir(Path(root)).recorded_vanilla()) is not None:
        wanted.append(("vanilla", vanilla))
    if outcomes_too:
        from .display import run_label
        wanted += [(run_label(o.chain, o.session), o.snapshot) for o in recorded_outcomes(root)]
    if not wanted:
        return []
    # opened only where it holds something: opening makes the directory (and writes into it)
    held = Path(store_root).is_dir() and any(Path(store_root).iterdir())
    store = SnapshotStore(store_root, use_dvc=False) if held else ()
    return [f"{what} {sid}" for what, sid in wanted if sid not in store]


def still_valid(outcome: SessionOutcome, protocol: str, parent_snapshot: str, redone: set[str]) -> bool:
    """Whether a recorded session still follows from the resumed run's state: the same parent, and (chain: this
    chain; sync-chain: any chain, through the fan-ins) no earlier session redone. Branching sessions stand alone."""
    if protocol == "branching":
        return outcome.parent_snapshot == parent_snapshot
    if outcome.parent_snapshot != parent_snapshot:
        return False
    return not redone if protocol == "sync-chain" else outcome.chain not in redone


def clear(path: Path) -> None:
    """Remove what an interrupted session (or fan-in) left, so that it is redone from scratch. Its workspace is an
    agent's, never sanitized if the session was cut off: removed as hostile input (a link is unlinked, never
    followed; no recursion, whatever the depth)."""
    remove_tree(path)
