"""A retained tree the store cannot take ends only its session: not retained, the reason recorded, the parent's
snapshot kept, nothing of it left in the store or the DVC repository, and the run goes on. Real DVC in a temporary
git + DVC repository."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from seis.engine_import import ENGINE_TEMPLATE
from seis.evaluator.snapshot import tree_sha256
from seis.session import SessionSpec, snapshot_or_keep_parent
from seis.session.steps import STORE_ERROR, gated_dir
from seis.store import SnapshotStore, StoreError, dvc_command
from seis.workspace import copy_tree

pytestmark = pytest.mark.skipif(dvc_command() is None, reason="DVC is not installed")

PARENT = "0" * 16


def _repo(path: Path) -> Path:
    """A git repository with DVC initialised in it (DVC then writes .gitignore entries, as in a real project)."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run([*dvc_command(), "init", "-q"], cwd=path, check=True)
    return path


def _judged(tmp_path: Path, plant: dict[str, str] | None = None) -> tuple[SessionSpec, SimpleNamespace]:
    """A passing gate result for the session's gated tree (the engine template, plus `plant`: path -> text)."""
    spec = SessionSpec(run_id="r", chain="c0", chain_index=0, session=1, parent_snapshot=PARENT,
                       session_dir=tmp_path / "session")
    copy_tree(ENGINE_TEMPLATE, gated_dir(spec))
    for rel, text in (plant or {}).items():
        (gated_dir(spec) / rel).parent.mkdir(parents=True, exist_ok=True)
        (gated_dir(spec) / rel).write_text(text)
    result = SimpleNamespace(verdict="pass", hashes=SimpleNamespace(candidate_tree=tree_sha256(gated_dir(spec))))
    return spec, result


def _leftovers(store: SnapshotStore) -> set[str]:
    """What the store holds besides its own scratch files."""
    return {p.name for p in store.root.iterdir()} - {".gitignore", ".lock"}


def _dvc_clean(repo: Path) -> bool:
    """`dvc status` finds nothing changed, missing or stray in the repository."""
    done = subprocess.run([*dvc_command(), "status"], cwd=repo, capture_output=True, text=True)
    return done.returncode == 0 and ("up to date" in done.stdout or "no data or pipelines tracked" in done.stdout)


def _ignored_entries(store: SnapshotStore) -> list[str]:
    """The store's .gitignore lines that DVC wrote for snapshot directories."""
    return [line for line in (store.root / ".gitignore").read_text().splitlines() if not line.startswith("/.")
            and not line.startswith("/*")]


# (file planted in the judged tree, what the reason names, its text)
CONTROL_FILES = [
    (".dvcignore", ".dvcignore", "*\n"),                      # `dvc add` would track an empty directory
    ("engine/.dvcignore", "engine/.dvcignore", "model.py\n"),  # `dvc add` fails
    (".gitignore", ".gitignore", "!*\n"),
    (".dvc/config", ".dvc", "[core]\n"),
    ("engine/x.dvc", "engine/x.dvc", "outs:\n- path: zz\n"),
    ("dvc.yaml", "dvc.yaml", "stages:\n  s:\n    cmd: touch pwned\n"),
]


@pytest.mark.parametrize("planted, control, text", CONTROL_FILES, ids=[c[0] for c in CONTROL_FILES])
def test_a_tree_holding_control_files_is_not_retained_and_leaves_no_trace(planted, control, text, tmp_path):
    repo = _repo(tmp_path / "repo")
    store = SnapshotStore(repo / "snapshots")
    spec, result = _judged(tmp_path, {planted: text})
    kept = snapshot_or_keep_parent(store, spec, result, True, ())
    assert kept.snapshot == PARENT and kept.retained is False
    assert len(kept.reasons) == 1 and kept.reasons[0].startswith("not retained: the snapshot could not be stored")
    assert control in kept.reasons[0] and str(tmp_path) not in kept.reasons[0]  # the tree's own terms only
    assert not (spec.session_dir / STORE_ERROR).exists()
    assert store.list() == [] and _leftovers(store) == set() and _ignored_entries(store) == []
    with pytest.raises(StoreError, match="control files"):  # the store itself refuses it, by name
        store.put(gated_dir(spec))
    # the store is still usable: the same engine without the control file is stored and tracked
    found = gated_dir(spec) / control
    if found.is_dir():
        shutil.rmtree(found)
    else:
        found.unlink()
    sid = store.put(gated_dir(spec))
    assert store.info(sid).dvc and _dvc_clean(repo)


def test_a_dvc_add_failure_is_a_not_retained_session_and_the_store_stays_usable(tmp_path):
    repo = _repo(tmp_path / "repo")
    (repo / ".gitignore").write_text("ignored/\n")  # DVC refuses to write a .dvc file git would ignore
    store = SnapshotStore(repo / "ignored" / "store")
    spec, result = _judged(tmp_path)
    kept = snapshot_or_keep_parent(store, spec, result, True, ())
    assert kept.snapshot == PARENT and not kept.retained
    # the reason reaches later agents: it says the store failed, never DVC's words or a host path; those are the
    # operator's, in the session's directory
    assert kept.reasons == ("not retained: the snapshot could not be stored: the snapshot store failed "
                            f"(see {STORE_ERROR})",)
    told = (spec.session_dir / STORE_ERROR).read_text()
    assert "could not be tracked with DVC" in told and "git-ignored" in told
    assert store.list() == [] and _leftovers(store) == set()
    # once git no longer ignores it, the same tree is stored: nothing of the failed put made it look stored
    (repo / ".gitignore").write_text("")
    sid = store.put(gated_dir(spec))
    assert (store.root / sid).is_dir() and store.info(sid).dvc and _dvc_clean(repo)


@pytest.mark.slow
def test_a_failed_push_undoes_the_add_and_a_later_put_pushes(tmp_path):
    repo = _repo(tmp_path / "repo")
    (tmp_path / "blocker").write_text("a file, so no remote can be made under it\n")
    dvc = dvc_command()
    subprocess.run([*dvc, "remote", "add", "-d", "shared", str(tmp_path / "blocker" / "remote")], cwd=repo,
                   check=True)
    store = SnapshotStore(repo / "snapshots")
    spec, result = _judged(tmp_path)
    kept = snapshot_or_keep_parent(store, spec, result, True, ("kept reason",))
    assert kept.snapshot == PARENT and not kept.retained and kept.reasons[0] == "kept reason"
    assert "could not be pushed to the DVC remote" in (spec.session_dir / STORE_ERROR).read_text()
    assert str(tmp_path) not in " ".join(kept.reasons)  # the remote's URL, the store's path: the operator's only
    # no directory, .dvc file or .gitignore entry left: DVC and git see nothing of it
    assert store.list() == [] and _leftovers(store) == set() and _ignored_entries(store) == []
    assert _dvc_clean(repo)
    subprocess.run([*dvc, "remote", "modify", "shared", "url", str(tmp_path / "remote")], cwd=repo, check=True)
    sid = store.put(gated_dir(spec))
    assert store.info(sid).dvc and any((tmp_path / "remote").rglob("*")) and _ignored_entries(store) == [f"/{sid}"]


def test_a_refused_session_is_recorded_and_the_next_session_runs(harness, tmp_path, monkeypatch):
    """Through tasks/session.py's session task, in a Prefect flow of two sessions with a fake agent and gate: the
    first candidate holds a .dvcignore, so it is not retained (outcome.json and report.md say why) and the second
    session starts from the vanilla engine and is retained."""
    from contextlib import nullcontext
    from dataclasses import replace

    from prefect import flow

    import seis.evaluator
    import tasks.session as ts
    from seis.agents import AgentResult
    from seis.agents.report import SessionBlock, render_report
    from seis.session.judge import Judgement
    from session_fakes import first_session

    def fake_agent(config, spec, workspace):
        (workspace.root / "engine" / "note.txt").write_text(f"session {spec.session}\n")
        if spec.session == 0:
            (workspace.root / ".dvcignore").write_text("*\n")
        block = SessionBlock(spec.chain, spec.session, "fake", applied=(f"edit-{spec.session}",))
        return AgentResult("fake", "edited", render_report(block, "an edit", [f"edit-{spec.session}"], []),
                           applied=block.applied)

    def fake_judge(config, spec, workspace, parent_dir):
        copy_tree(workspace.root, gated_dir(spec))
        gate = SimpleNamespace(verdict="pass", speed=None, failed_checks=(),
                               hashes=SimpleNamespace(candidate_tree=tree_sha256(gated_dir(spec))))
        return Judgement(gate, ())

    monkeypatch.setattr(ts, "run_agent", fake_agent)
    monkeypatch.setattr(ts, "judge", fake_judge)
    monkeypatch.setattr(ts, "gpu_slot", lambda *a, **k: nullcontext())
    monkeypatch.setattr(ts, "render_gate_for_agents", lambda gate: "fake gate: pass")
    monkeypatch.setattr(seis.evaluator, "render_gate_for_agents", lambda gate: "fake gate: pass")

    repo = _repo(tmp_path / "repo")
    store = SnapshotStore(repo / "snapshots")
    config, first = first_session(tmp_path, store)
    vanilla = first.parent_snapshot

    @flow
    def two_sessions():
        s0 = ts.session_task(config, first, store.root)
        second = replace(first, session=1, parent_snapshot=s0.outcome.snapshot,
                         session_dir=tmp_path / "run" / "chains" / "c0" / "001")
        return s0, ts.session_task(config, second, store.root)

    s0, s1 = two_sessions()
    assert s0.outcome.verdict == "pass" and not s0.outcome.retained and s0.outcome.snapshot == vanilla
    assert ".dvcignore" in s0.outcome.reasons[-1]
    recorded = json.loads((first.session_dir / "outcome.json").read_text())
    assert recorded["retained"] is False and ".dvcignore" in recorded["reasons"][-1]
    assert ".dvcignore" in (first.session_dir / "report.md").read_text()
    assert s1.outcome.parent_snapshot == vanilla and s1.outcome.retained and s1.outcome.snapshot != vanilla
    assert {s.id for s in store.list()} == {vanilla, s1.outcome.snapshot} and _dvc_clean(repo)


@pytest.mark.parametrize("planted", [".git", "engine/.git/HEAD"])
def test_git_metadata_in_a_tree_never_reaches_the_store(planted, tmp_path):
    """.git (a gitlink file or a directory) is no part of an engine tree: the tree is stored, without it."""
    repo = _repo(tmp_path / "repo")
    store = SnapshotStore(repo / "snapshots")
    spec, result = _judged(tmp_path, {planted: "gitdir: ../elsewhere\n"})
    kept = snapshot_or_keep_parent(store, spec, result, True, ())
    assert kept.retained, kept.reasons
    stored = store.info(kept.snapshot).path
    assert not list(stored.rglob(".git")) and _dvc_clean(repo)


@pytest.mark.parametrize("planted", [".lock", ".gitignore", "{sid}.json", "{sid}.dvc"])
def test_a_link_planted_among_the_stores_own_files_is_refused_and_reaches_no_host_file(planted, tmp_path):
    """A clone's commit can hold a symbolic link where the store keeps its own files: the lock (truncated when
    taken), `.gitignore` (written, and appended to by DVC), a manifest's `.part` and a `.dvc` file (written by
    name). The store refuses to act while one is there, and the file it points at stays as it was."""
    from seis.workspace import tree_hash
    host_file = tmp_path / "host" / "authorized_keys"
    host_file.parent.mkdir()
    host_file.write_text("precious\n")
    root = tmp_path / "store"
    store = SnapshotStore(root, use_dvc=False)
    sid = tree_hash(ENGINE_TEMPLATE)[: store.id_len]
    link = root / planted.format(sid=sid)
    link.unlink(missing_ok=True)
    link.symlink_to(host_file)
    with pytest.raises(StoreError, match="symbolic links"):
        store.put(ENGINE_TEMPLATE)
    with pytest.raises(StoreError, match="symbolic links"):
        SnapshotStore(root, use_dvc=False)
    assert host_file.read_text() == "precious\n"
    assert not (root / sid).exists()   # nothing stored
    link.unlink()
    assert SnapshotStore(root, use_dvc=False).put(ENGINE_TEMPLATE) == sid  # usable again once it is gone
