"""A run judges each candidate once: a session whose candidate the run has already gated (the same tree, against the
same reference and parent, by the same evaluator code under the same gate configuration) takes that verdict
instead of spending the device on measuring it again.

After a fan-in, every chain of a sync run can hold the same engine and pick the same next step; without reuse each
chain would gate that same tree. The tree is hashed from the session's own private copy (what would be retained),
and the earlier gate.json must name that tree, parent and evaluator, so neither a hostile workspace nor a stale
index can lend a candidate someone else's verdict. Verdicts live in the run directory (`verdicts/<key>.json` ->
the session that was gated), which no agent can reach.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..files import write_atomic
from ..workspace.tree import TreeError, remove_tree

VERDICTS = "verdicts"
REUSED = "gate-reused.json"   # in a session that took an earlier verdict: which one


@dataclass(frozen=True)
class ReusedVerdict:
    result: object          # the earlier session's GateResult
    gated_session: str      # its session directory, relative to the run (chains/<chain>/<session>)


def _run_root(session_dir: Path) -> Path:
    return Path(session_dir).parents[2]  # runs/<id>/chains/<chain>/<session>


def verdict_key(gate_config, candidate_tree: str, evaluator_source: str) -> str:
    """What decides a verdict, less where this session keeps its files (candidate, parent and retain paths)."""
    judged = gate_config.model_dump(mode="json", exclude={"candidate", "parent", "retain_dir"})
    text = json.dumps({"candidate_tree": candidate_tree, "evaluator": evaluator_source, "gate": judged},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _matches(result, candidate_tree: str, evaluator_source: str, parent_snapshot: str | None) -> bool:
    h = result.hashes
    return (result.verdict in ("pass", "fail") and h.candidate_tree == candidate_tree
            and h.evaluator_source == evaluator_source and h.snapshots.get("parent") == parent_snapshot)


def _discard(path: Path) -> None:
    """Best effort, as hostile input (no link followed, no recursion): a copy of a candidate, or what an
    interrupted attempt left where one goes."""
    try:
        remove_tree(path)
    except (OSError, TreeError):
        pass


def reuse_verdict(gate_config, session_dir: Path, retain_dir: Path) -> ReusedVerdict | None:
    """The verdict an earlier session of this run reached on exactly this candidate, or None (gate it). On a reused
    pass, retain_dir holds this session's own copy of the tree (hashed: the one the verdict names)."""
    from ..evaluator import GateInputError, GateResult
    from ..evaluator.gate import evaluator_source_sha256
    from ..evaluator.snapshot import snapshot

    root = _run_root(session_dir)
    if not any((root / VERDICTS).glob("*.json")):  # nothing judged yet: no copy to hash
        return None
    copy = Path(retain_dir).with_name(Path(retain_dir).name + ".reuse")
    _discard(copy)
    try:
        snap = snapshot(gate_config.candidate, copy, max_bytes=gate_config.isolation.max_tree_mb * 2**20)
    except (GateInputError, OSError):  # the gate itself refuses such a tree, with its reason
        _discard(copy)
        return None
    source = evaluator_source_sha256()
    key = verdict_key(gate_config, snap.sha256, source)
    try:
        gated = json.loads((root / VERDICTS / f"{key}.json").read_text())["session"]
        result = GateResult.model_validate_json((root / gated / "gate.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        result = None
    if result is None or not _matches(result, snap.sha256, source, gate_config.parent_snapshot):
        remove_tree(copy)
        return None
    _discard(retain_dir)
    if result.verdict == "pass":
        copy.rename(retain_dir)
    else:
        remove_tree(copy)
    # the speed table travels with the record: the gated session can be redone (and cleared) by a resume that
    # keeps this one, and its gate.json would then be gone, or another candidate's
    speed = result.speed.model_dump(mode="json") if result.speed is not None else None
    (Path(session_dir) / REUSED).write_text(json.dumps({"session": gated, "key": key, "speed": speed}, indent=2)
                                            + "\n")
    return ReusedVerdict(result, gated)


def _record(session_dir: Path) -> dict:
    try:
        record = json.loads((Path(session_dir) / REUSED).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def reused_from(session_dir: Path) -> str:
    """The session (chains/<chain>/<session>) whose verdict this one took, or ''."""
    session = _record(session_dir).get("session")
    return session if isinstance(session, str) else ""


def reused_speed(session_dir: Path) -> tuple[bool, dict | None]:
    """(recorded, the speed table) of the verdict this session took, as recorded when it took it; records written
    before the table was kept have none (recorded False: read the gated session's gate.json instead)."""
    record = _record(session_dir)
    return ("speed" in record, record.get("speed") if isinstance(record.get("speed"), dict) else None)


def remember_verdict(gate_config, session_dir: Path, result) -> None:
    """Index a verdict this session's gate reached, for later sessions of the run with the same candidate."""
    if result.verdict not in ("pass", "fail"):
        return
    root = _run_root(session_dir)
    key = verdict_key(gate_config, result.hashes.candidate_tree, result.hashes.evaluator_source)
    index = root / VERDICTS
    index.mkdir(exist_ok=True)
    # a part file of its own: two chains can reach the same candidate's verdict at once
    write_atomic(index / f"{key}.json", json.dumps({"session": str(Path(session_dir).relative_to(root))}) + "\n")
