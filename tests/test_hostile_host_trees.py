"""What an agent leaves in its tree, against the host code that hashes, copies, diffs and stores it: names no
engine tree may hold (not UTF-8, control characters), repositories of tools the cleanup did not know, and diffs
whose cost grows faster than their size. Each test fails on the code before its fix. CPU only."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from seis.agents.llm.confine import sanitize_workspace
from seis.engine_import import ENGINE_TEMPLATE
from seis.store import SnapshotStore, StoreError
from seis.workspace import TreeError, copy_tree, diff_trees, tree_files, tree_hash
from seis.workspace.tree import read_tree_file

# Names the cleanup removes from a workspace: bytes that are not UTF-8, a newline (a forged line in a diff or a
# report), an escape sequence, a bidi override.
BAD_NAMES = [b"engine/\xff\xfe.py", "engine/a\n+++ forged.py".encode(), b"engine/\x1b[2Jclear.py",
             "engine/\u202eyp.txt".encode()]


def _tree_with(tmp_path: Path, name: bytes) -> Path:
    tree = tmp_path / "tree"
    copy_tree(ENGINE_TEMPLATE, tree)
    with open(os.open(os.fsencode(tree) + b"/" + name, os.O_WRONLY | os.O_CREAT, 0o644), "w") as f:
        f.write("x = 1\n")
    return tree


@pytest.mark.parametrize("name", BAD_NAMES, ids=["not-utf8", "newline", "escape", "bidi"])
@pytest.mark.parametrize("walk", ["tree_files", "tree_hash", "copy_tree", "diff_trees", "read_tree_file"])
def test_a_name_no_engine_tree_may_hold_is_a_tree_error_to_every_walk(tmp_path, name, walk):
    """A name that is not UTF-8 made tree_hash raise UnicodeEncodeError, which no caller takes for a refusal (the
    store, the gate's hash and the verdict reuse catch TreeError), and a newline in a name forged lines in the
    session's diff: every walk refuses what the cleanup would remove, with a TreeError."""
    tree = _tree_with(tmp_path, name)
    calls = {"tree_files": lambda: tree_files(tree), "tree_hash": lambda: tree_hash(tree),
             "copy_tree": lambda: copy_tree(tree, tmp_path / "copy"),
             "diff_trees": lambda: diff_trees(ENGINE_TEMPLATE, tree),
             "read_tree_file": lambda: read_tree_file(tree, os.fsdecode(name))}
    with pytest.raises(TreeError):
        calls[walk]()


@pytest.mark.parametrize("name", BAD_NAMES, ids=["not-utf8", "newline", "escape", "bidi"])
def test_the_store_refuses_such_a_name_as_a_store_error_and_keeps_nothing(tmp_path, name):
    """put raised UnicodeEncodeError, which the session's retention step does not catch: the run stopped."""
    tree = _tree_with(tmp_path, name)
    store = SnapshotStore(tmp_path / "store", use_dvc=False)
    with pytest.raises(StoreError):
        store.put(tree)
    assert {p.name for p in store.root.iterdir()} <= {".gitignore", ".lock"}


def test_the_cleanup_and_the_walks_agree_on_names(tmp_path):
    """What the cleanup leaves is an engine tree every walk takes (the rule is one function)."""
    tree = _tree_with(tmp_path, BAD_NAMES[0])
    problems = sanitize_workspace(tree)
    assert any("not UTF-8" in p for p in problems)
    assert "engine/__init__.py" in tree_files(tree) and tree_hash(tree)


@pytest.mark.parametrize("dot_dir", [".sl", ".pijul"])
def test_a_repository_of_any_tool_is_removed_by_the_cleanup_and_refused_by_the_store(tmp_path, dot_dir):
    """A kept workspace (or a snapshot in the store's repository) holding `.sl/config` is a Sapling repository, whose
    hooks (`[hooks] pre-status = ...`, as in Mercurial's `.hg/hgrc`) run as whoever runs `sl` there, root included;
    `.pijul` makes a Pijul one. The cleanup removed `.hg` and `.jj` but left these."""
    tree = tmp_path / "tree"
    copy_tree(ENGINE_TEMPLATE, tree)
    (tree / "engine" / dot_dir).mkdir()
    (tree / "engine" / dot_dir / "config").write_text("[hooks]\npre-status = touch /tmp/owned\n")
    (tree / "engine" / dot_dir / "requires").write_text("store\n")
    with pytest.raises(StoreError, match="control files"):
        SnapshotStore(tmp_path / "store", use_dvc=False).put(tree)
    problems = sanitize_workspace(tree)
    assert any(f"engine/{dot_dir}/" in p for p in problems), problems
    assert not (tree / "engine" / dot_dir).exists()


def _quadratic_pair(lines: int) -> tuple[str, str]:
    """Old and new text of one file that difflib needs far more time for than its diff's size says: short lines
    that each repeat just under difflib's 1% junk threshold, reordered (50 s for 75 KB of diff at 10,000 lines)."""
    period = 103
    return ("".join(f"{i % period}\n" for i in range(lines)),
            "".join(f"{i * 13 % period}\n" for i in range(lines)))


def test_a_file_difflib_would_take_a_minute_over_is_named_not_diffed(tmp_path):
    """Session k retains an inert 10,000-line file, session k+1 reorders it: the orchestrator's diff of it took
    about a minute of CPU, and the 8 MiB diff cap let about a hundred such files through (1.5 hours a session)."""
    old, new = tmp_path / "old", tmp_path / "new"
    a, b = _quadratic_pair(10_000)
    for tree, text in ((old, a), (new, b)):
        copy_tree(ENGINE_TEMPLATE, tree)
        (tree / "engine" / "table.py").write_text(text)
    t0 = time.monotonic()
    text = diff_trees(old, new)
    assert time.monotonic() - t0 < 10
    assert "diff --git a/engine/table.py b/engine/table.py\n# not shown: too many lines" in text


def test_the_whole_diff_has_a_work_budget(tmp_path, monkeypatch):
    """Each file within the per-file bound, but many of them: past the diff's work budget files are named only."""
    import seis.workspace.diff as diff_mod
    monkeypatch.setattr(diff_mod, "MAX_DIFF_WORK", 3 * 1000 * 1000)
    old, new = tmp_path / "old", tmp_path / "new"
    a, b = _quadratic_pair(1000)
    for tree, text in ((old, a), (new, b)):
        copy_tree(ENGINE_TEMPLATE, tree)
        for i in range(5):
            (tree / "engine" / f"table{i}.py").write_text(text)
    text = diff_trees(old, new)
    assert [f"engine/table{i}.py" in text for i in range(5)] == [True] * 5  # every changed file is named
    assert text.count("+++ b/engine/table") == 3
    assert text.count("# not shown: the diff is past its work limit") == 2


def test_no_copy_of_a_tree_has_a_directory_others_can_write_whatever_the_umask(tmp_path):
    """The gate's judged copy, its retained copy and the store's snapshot are copy_tree's: files were made 0644 or
    0755 but directories took the process's umask, 0777 under umask 0 (a service's default in some setups), so
    any local user could swap the code of a judged tree or a stored snapshot."""
    old = os.umask(0)
    try:
        copy_tree(ENGINE_TEMPLATE, tmp_path / "copy")
        sid = SnapshotStore(tmp_path / "store", use_dvc=False).put(tmp_path / "copy")
    finally:
        os.umask(old)
    for root in (tmp_path / "copy", tmp_path / "store" / sid):
        for p in [root, *root.rglob("*")]:
            assert not os.lstat(p).st_mode & 0o022, (p, oct(os.lstat(p).st_mode))
