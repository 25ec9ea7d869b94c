"""Session workspaces: prepare (engine tree + reports + peers), diff against the parent, tree hash."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from seis.engine_import import ENGINE_TEMPLATE
from seis.workspace import (PeerMaterial, Report, TreeError, copy_tree, diff_workspace, prepare_workspace,
                            tree_files, tree_hash)


@pytest.fixture
def parent(tmp_path):
    """A parent engine tree: E0 plus NOTES.md."""
    d = tmp_path / "parent"
    copy_tree(ENGINE_TEMPLATE, d)
    (d / "NOTES.md").write_text("notes from session 0\n")
    return d


def _report(chain="c0", session=1, verdict="retained"):
    return Report(chain, session, f"# Session {chain}/{session}\n\nbody\n", verdict)


def test_prepare_copies_engine_reports_and_peers(parent, tmp_path):
    peer = tmp_path / "peer"
    copy_tree(ENGINE_TEMPLATE, peer)
    ws = prepare_workspace(parent, tmp_path / "ws", [_report(session=2), _report(session=1, verdict="rejected")],
                           [PeerMaterial("c1", peer, (_report("c1", 1),))])
    root = ws.root
    assert (root / "engine" / "engine.py").read_bytes() == (parent / "engine" / "engine.py").read_bytes()
    assert (root / "CONTRACT.md").is_file() and (root / "NOTES.md").read_text() == "notes from session 0\n"
    assert [p.name for p in ws.reports] == ["c0-001.md", "c0-002.md"]  # oldest first
    index = json.loads((root / "reports" / "index.json").read_text())
    assert [(e["session"], e["verdict"]) for e in index] == [(1, "rejected"), (2, "retained")]
    assert ws.peers == {"c1": root / "peers" / "c1"}
    assert (root / "peers" / "c1" / "engine" / "model.py").is_file()
    assert (root / "peers" / "c1" / "reports" / "c1-001.md").is_file()
    # Reports and peers are session material, not engine code.
    assert tree_hash(root) == tree_hash(parent) == ws.parent_hash
    assert diff_workspace(parent, root) == "" and not ws.changed()


def test_prepare_refuses_a_non_empty_destination_and_a_non_engine(parent, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(TreeError, match="not empty"):
        prepare_workspace(parent, tmp_path / "busy")
    with pytest.raises(TreeError, match="engine package"):
        prepare_workspace(tmp_path / "busy", tmp_path / "ws")
    with pytest.raises(ValueError, match="chain id"):
        Report("../evil", 1, "")


def test_diff_shows_edits_additions_and_deletions_and_applies_with_git(parent, tmp_path):
    ws = prepare_workspace(parent, tmp_path / "ws").root
    model = ws / "engine" / "model.py"
    model.write_text(model.read_text().replace("class CausalLM:", "class CausalLM:  # edited"))
    (ws / "engine" / "extra.py").write_text("X = 1")  # no trailing newline
    (ws / "NOTES.md").unlink()
    diff = diff_workspace(parent, ws)
    assert diff == diff_workspace(parent, ws)  # stable
    assert "--- a/engine/model.py\n+++ b/engine/model.py\n" in diff
    assert "+class CausalLM:  # edited\n" in diff
    assert "--- /dev/null\n+++ b/engine/extra.py\n" in diff and "\\ No newline at end of file" in diff
    assert "--- a/NOTES.md\n+++ /dev/null\n" in diff
    order = [line.split(" b/")[1] for line in diff.splitlines() if line.startswith("diff --git")]
    assert order == sorted(order)
    # The diff is a real patch: applied to the parent it gives the workspace.
    copy = tmp_path / "copy"
    copy_tree(parent, copy)
    (copy / "p.diff").write_text(diff)
    done = subprocess.run(["git", "apply", "p.diff"], cwd=copy, capture_output=True, text=True,
                          env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    (copy / "p.diff").unlink()
    assert tree_hash(copy) == tree_hash(ws)


def test_a_diff_names_files_past_its_limits_and_stays_small(parent, tmp_path, monkeypatch):
    """The diff is built in the orchestrator's process from what an agent wrote: a file of 2-byte lines at the
    per-file limit of a workspace would take GBs as difflib lines. Past a size or a line count a file is named,
    not diffed, and past the diff's own size the rest are only named; the small edit beside them still shows."""
    from seis.workspace import diff as diff_mod
    monkeypatch.setattr(diff_mod, "MAX_DIFF_CHARS", 2_000)
    ws = tmp_path / "ws"
    copy_tree(parent, ws)
    (ws / "engine" / "big.txt").write_bytes(b"x\n" * (3 << 20))        # 6 MiB
    (ws / "engine" / "lines.txt").write_bytes(b"y\n" * 20_000)          # 40 kB, 20,000 lines
    (ws / "NOTES.md").write_text("edited\n")
    (ws / "engine" / "many.py").write_text("x = 1\n" * 1_000)       # shown: the diff passes its limit here
    (ws / "zz.txt").write_text("last\n")
    diff = diff_workspace(parent, ws)
    assert "-notes from session 0\n+edited\n" in diff
    assert "diff --git a/engine/big.txt b/engine/big.txt\n# not shown: larger than 1 MiB\n" in diff
    assert "diff --git a/engine/lines.txt b/engine/lines.txt\nnew file mode 100644\n# not shown: more than " \
           "10,000 lines\n" in diff
    assert diff.count("+x = 1\n") == 1_000
    assert "diff --git a/zz.txt b/zz.txt\n# not shown: the diff is past its size limit\n" in diff
    assert len(diff) < 20_000


def test_a_diff_past_its_limit_stops_naming_files(parent, tmp_path, monkeypatch):
    """Past its size the diff named every further file, twice in its header: a workspace may hold 100,000 files
    with 1,000-byte paths, 200 MB of names built in the orchestrator and written for each session. It names them
    up to a limit of their own, then counts the rest."""
    from seis.workspace import diff as diff_mod
    monkeypatch.setattr(diff_mod, "MAX_DIFF_CHARS", 2_000)
    monkeypatch.setattr(diff_mod, "MAX_NAMED_CHARS", 5_000)
    ws = tmp_path / "ws"
    copy_tree(parent, ws)
    (ws / "engine" / "many.py").write_text("x = 1\n" * 1_000)
    (ws / "engine" / "z").mkdir()
    for i in range(2_000):
        (ws / "engine" / "z" / f"{i:04d}-{'n' * 200}.py").write_text("")
    diff = diff_workspace(parent, ws)
    assert diff.count("+x = 1\n") == 1_000 and len(diff) < 2_000 + 5_000 + 10_000
    assert diff.endswith("more files differ, not named: the diff is past its size limit\n")


def test_hash_is_stable_and_ignores_caches_and_session_dirs(parent, tmp_path):
    h = tree_hash(parent)
    assert h == tree_hash(parent) and len(h) == 64
    (parent / "engine" / "__pycache__").mkdir(exist_ok=True)
    (parent / "engine" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0junk")
    (parent / "engine" / "stray.pyc").write_bytes(b"\0")
    (parent / "reports").mkdir()
    (parent / "reports" / "r.md").write_text("r")
    assert tree_hash(parent) == h
    assert not any("__pycache__" in f or f.startswith("reports/") for f in tree_files(parent))
    # A nested directory called reports is engine code, and any byte counts.
    (parent / "engine" / "reports").mkdir()
    (parent / "engine" / "reports" / "x.py").write_text("")
    h2 = tree_hash(parent)
    assert h2 != h
    (parent / "CONTRACT.md").write_bytes((parent / "CONTRACT.md").read_bytes() + b" ")
    assert tree_hash(parent) != h2


@pytest.mark.parametrize("where", ["engine/alias.py", "engine/kernels", "leak"])
def test_a_link_anywhere_is_refused_never_followed(parent, tmp_path, where):
    """In the tree or out of it, a link is never followed: hash, file list and copy refuse the tree."""
    outside = tmp_path / "secret.txt"
    outside.write_text("s")
    link = parent / where
    if link.exists():
        shutil.rmtree(link) if link.is_dir() else link.unlink()
    link.symlink_to(parent / "engine" / "batch.py" if where == "engine/alias.py" else outside)
    for read in (tree_files, tree_hash, lambda p: copy_tree(p, tmp_path / "copy")):
        with pytest.raises(TreeError, match="symlink"):
            read(parent)
    assert not any(f.name == "secret.txt" for f in (tmp_path / "copy").rglob("*"))
