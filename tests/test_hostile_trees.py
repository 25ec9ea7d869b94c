"""Trees a hostile agent or engine leaves behind, against the host code that walks and removes them: nesting
thousands of levels deep (past Python's recursion limit), links, FIFOs, 0500 directories, names that collide with
the remover's own. Each walk refuses such a tree with a TreeError; each removal removes it and touches nothing
outside. CPU only."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from deep_trees import chain, host_file, no_deep_leftovers  # noqa: F401 (fixtures)
from seis.workspace.tree import (MAX_DEPTH, TreeError, copy_tree, remove_tree, scratch_dir, tree_files,
                                 tree_hash)


@pytest.mark.parametrize("walk", [tree_files, tree_hash, lambda root: copy_tree(root, root.parent / "copy")])
def test_a_tree_thousands_deep_is_refused_not_recursed_into(tmp_path, walk):
    tree = tmp_path / "tree"
    tree.mkdir()
    chain(tree, 3000)
    with pytest.raises(TreeError, match=f"more than {MAX_DEPTH} directories deep"):
        walk(tree)


def test_a_tree_at_the_depth_limit_is_still_an_engine_tree(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    chain(tree, MAX_DEPTH - 1)
    assert tree_files(tree) == ["d/" * (MAX_DEPTH - 1) + "f"]


def test_remove_tree_removes_any_depth_and_kind_and_nothing_outside(tmp_path, host_file):
    host_dir_mode = stat.S_IMODE(host_file.parent.stat().st_mode)
    tree = tmp_path / "tree"
    tree.mkdir()
    chain(tree, 3000)
    (tree / "link").symlink_to(host_file)
    (tree / "dirlink").symlink_to(host_file.parent, target_is_directory=True)
    os.mkfifo(tree / "fifo")
    (tree / ".seis-rm-1").write_text("a name the remover might pick")
    (tree / "sub" / ".seis-rm-2").mkdir(parents=True)
    (tree / "sub" / ".seis-rm-2" / "x").write_text("x")
    (tree / "locked" / "inner").mkdir(parents=True)
    (tree / "locked" / "inner" / "f").write_text("x")
    (tree / "locked").chmod(0o500)
    remove_tree(tree)
    assert not tree.exists()
    assert host_file.read_text() == "KEY=host-secret"
    assert stat.S_IMODE(host_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(host_file.parent.stat().st_mode) == host_dir_mode
    remove_tree(tree)  # already gone: nothing to do


def test_remove_tree_of_a_link_removes_the_link_only(tmp_path, host_file):
    link = tmp_path / "link"
    link.symlink_to(host_file.parent, target_is_directory=True)
    remove_tree(link)
    assert not link.is_symlink() and host_file.read_text() == "KEY=host-secret"


def test_a_scratch_dir_is_removed_whatever_was_left_in_it(tmp_path, host_file):
    with scratch_dir("seis-test-") as scratch:
        chain(scratch, 2000)
        (scratch / "link").symlink_to(host_file)
        (scratch / "d").chmod(0o500)
    assert not scratch.exists()
    assert host_file.read_text() == "KEY=host-secret"
