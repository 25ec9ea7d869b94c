"""seis.sandbox.walk, the one path walk that the host's read-only looks at sandbox-written trees share (secret scan,
search and list tools, write watch), and the watch's answer to what such a walk cannot see. CPU only."""
from __future__ import annotations

import errno
import os
from pathlib import Path

from deep_trees import DEEP, chain, host_file, no_deep_leftovers  # noqa: F401 (fixtures)
from seis.sandbox.policy import Limits
from seis.sandbox.walk import Entry, Unreadable, walk
from seis.sandbox.write_watch import over_limits


def _names(root: Path, **kw) -> list[str]:
    out = []
    for item in walk(root, **kw):
        kind = type(item).__name__
        out.append(f"{kind}:{os.path.relpath(item.path, root)}" + (f"@{item.depth}" if kind == "Entry" else ""))
    return out


def test_entries_come_sorted_each_directory_before_its_content(tmp_path):
    for rel in ("b/z.txt", "b/a.txt", "a/x/y.txt", "c.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    assert _names(tmp_path) == ["Entry:a@1", "Entry:b@1", "Entry:c.txt@1", "Entry:a/x@2", "Entry:a/x/y.txt@3",
                                "Entry:b/a.txt@2", "Entry:b/z.txt@2"]
    assert sorted(_names(tmp_path, ordered=False)) == sorted(_names(tmp_path))


def test_links_are_listed_never_followed_and_enter_can_keep_directories_out(tmp_path, host_file):
    tree = tmp_path / "tree"
    (tree / "__pycache__").mkdir(parents=True)
    (tree / "__pycache__" / "m.pyc").write_bytes(b"x")
    (tree / "to_host").symlink_to(host_file.parent, target_is_directory=True)
    names = _names(tree, enter=lambda e: e.name != "__pycache__")
    assert names == ["Entry:__pycache__@1", "Entry:to_host@1"]  # nothing of the host directory, nor the cache


def _swap_for_link(directory: Path, target: Path) -> None:
    directory.rename(directory.with_name(directory.name + ".old"))
    directory.symlink_to(target, target_is_directory=True)


def test_a_directory_swapped_for_a_link_after_its_listing_is_not_entered(tmp_path, host_file):
    """What a sandbox still running can do to the write watch: list `a` as a directory, then make it a link to a
    host directory before the walk enters it. `enter` runs between the two, so the swap lands there."""
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)

    def swap(entry: os.DirEntry) -> bool:
        _swap_for_link(tree / "a", host_file.parent)
        return True

    items = list(walk(tree, enter=swap))
    assert not any(i.path.name == host_file.name for i in items), "a host directory was listed"
    assert [(type(i), i.path) for i in items][-1] == (Unreadable, tree / "a")
    assert items[-1].error.errno in (errno.ENOTDIR, errno.ELOOP)  # a link is not opened as a directory


def test_an_ancestor_swapped_for_a_link_to_a_lookalike_host_directory_is_not_entered(tmp_path, host_file):
    """The deeper form: `a/b` is listed, then `a` becomes a link to a host directory that also holds a `b`. The
    path a/b now names the host's b; its inode is not the one listed, so it is never listed."""
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    lookalike = host_file.parent / "b"
    lookalike.mkdir()
    (lookalike / "host-only.txt").write_text("host")

    def swap(entry: os.DirEntry) -> bool:
        if entry.name == "b":
            _swap_for_link(tree / "a", host_file.parent)
        return True

    items = list(walk(tree, enter=swap))
    assert not any(i.path.name == "host-only.txt" for i in items), "a host directory was listed"
    assert isinstance(items[-1], Unreadable) and items[-1].path == tree / "a" / "b"
    assert items[-1].error.errno == errno.ESTALE


def test_the_depth_cap_lists_a_directory_without_entering_it(tmp_path):
    chain(tmp_path, 5)
    assert _names(tmp_path, max_depth=3) == ["Entry:d@1", "Entry:d/d@2", "TooDeep:d/d/d"]


def test_a_chain_past_the_recursion_limit_is_walked_to_its_bottom_without_a_cap(tmp_path):
    chain(tmp_path, DEEP)
    items = list(walk(tmp_path, max_depth=None, ordered=False))
    assert len(items) == DEEP + 1 and all(isinstance(i, Entry) for i in items)
    assert items[-1].path.name == "f" and items[-1].depth == DEEP + 1


def test_an_unlistable_directory_is_reported_not_raised(tmp_path):
    assert [type(i) for i in walk(tmp_path / "gone")] == [Unreadable]


def _sparse_file_at_the_bottom(root: Path, depth: int, size: int) -> None:
    """root/d/.../d/big, `depth` levels, made relative to each level (its path is longer than PATH_MAX)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    big = os.open("big", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
    os.ftruncate(big, size)
    os.close(big)
    os.close(fd)


def test_the_write_watch_does_not_let_bytes_hide_below_a_path_too_long_to_name(tmp_path):
    """A sandbox can nest directories until their path passes PATH_MAX (4,096 bytes), where a path walk cannot
    list them; what lies below would never be counted. The watch calls that a breach instead of passing it."""
    limits = Limits(max_written_bytes=2**30, max_written_entries=100_000)
    shallow = tmp_path / "shallow"
    _sparse_file_at_the_bottom(shallow, 10, 2 * 2**30)
    assert "more than 1.0 GiB" in over_limits([str(shallow)], limits, "its cache")
    deep = tmp_path / "deep"
    _sparse_file_at_the_bottom(deep, 2100, 2 * 2**30)  # 2 bytes a level: past 4,096 bytes
    why = over_limits([str(deep)], limits, "its cache")
    assert why is not None and "cannot list" in why, why
