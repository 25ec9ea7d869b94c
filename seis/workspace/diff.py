"""Unified diff of two engine trees (parent -> workspace), stable and `git apply`-able (but for the files past the
limits below, which it only names)."""
from __future__ import annotations

import difflib
import os
from pathlib import Path

from .tree import read_tree_file, tree_files

_NO_EOL = "\\ No newline at end of file\n"
# The diff is for people, and an agent wrote the tree: a file past these is named as changed, not diffed (difflib
# can take quadratic time and holds every line as an object), past MAX_DIFF_CHARS the files are only named, and past
# MAX_NAMED_CHARS more only counted (a workspace may hold 100,000 files with 1,000-byte paths: 200 MB of names).
MAX_DIFF_FILE_BYTES = 1 << 20
MAX_DIFF_LINES = 10_000
MAX_DIFF_CHARS = 8 << 20
MAX_NAMED_CHARS = 1 << 20
# difflib's time grows with old lines x new lines (and faster), not with the diff's size: a changed file of 10,000
# short lines, each repeated just under difflib's 1% junk threshold and reordered, took 50 s for 75 KB of diff, so
# the 8 MiB above let one session hold the orchestrator's CPU for about 1.5 hours. A file is diffed only while its
# old x new line count stays within MAX_DIFF_PAIRS, and the whole diff within MAX_DIFF_WORK of them (new and
# deleted files cost nothing); past either, it is named, not diffed. Ordinary source files are far below both.
MAX_DIFF_PAIRS = 4_000_000
MAX_DIFF_WORK = 40_000_000


def _text(data: bytes) -> list[str] | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _mode(path: Path) -> str:
    return "100755" if os.lstat(path).st_mode & 0o111 else "100644"


def _file_diff(rel: str, old: bytes | None, new: bytes | None, mode: str, work_left: int) -> tuple[str, int]:
    """The file's diff, and the work (old x new lines) difflib spent on it."""
    a_name = f"a/{rel}" if old is not None else "/dev/null"
    b_name = f"b/{rel}" if new is not None else "/dev/null"
    a_lines, b_lines = _text(old or b""), _text(new or b"")
    header = f"diff --git a/{rel} b/{rel}\n"
    if old is None:
        header += f"new file mode {mode}\n"
    elif new is None:
        header += f"deleted file mode {mode}\n"
    if a_lines is None or b_lines is None:
        return header + f"Binary files {a_name} and {b_name} differ\n", 0
    if max(len(a_lines), len(b_lines)) > MAX_DIFF_LINES:
        return header + f"# not shown: more than {MAX_DIFF_LINES:,} lines\n", 0
    work = len(a_lines) * len(b_lines)
    if work > MAX_DIFF_PAIRS:
        return header + "# not shown: too many lines on both sides to diff\n", 0
    if work > work_left:
        return header + "# not shown: the diff is past its work limit\n", 0
    out = [header]
    for line in difflib.unified_diff(a_lines, b_lines, a_name, b_name, n=3):
        # difflib leaves a last line without "\n" as is; git marks it explicitly.
        out.append(line if line.endswith("\n") else line + "\n" + _NO_EOL)
    return "".join(out), work


def diff_trees(old_dir: str | Path, new_dir: str | Path) -> str:
    """Diff of every engine-tree file that differs, in sorted path order ('' when the trees are equal)."""
    old_dir, new_dir = Path(old_dir), Path(new_dir)
    old_files, new_files = set(tree_files(old_dir)), set(tree_files(new_dir))
    parts, size, unnamed, work_left = [], 0, 0, MAX_DIFF_WORK
    for rel in sorted(old_files | new_files):
        old = read_tree_file(old_dir, rel) if rel in old_files else None
        new = read_tree_file(new_dir, rel) if rel in new_files else None
        if old == new:
            continue
        if size > MAX_DIFF_CHARS + MAX_NAMED_CHARS:
            unnamed += 1
            continue
        if max(len(old or b""), len(new or b"")) > MAX_DIFF_FILE_BYTES:
            part = f"diff --git a/{rel} b/{rel}\n# not shown: larger than {MAX_DIFF_FILE_BYTES // 2**20} MiB\n"
        elif size > MAX_DIFF_CHARS:
            part = f"diff --git a/{rel} b/{rel}\n# not shown: the diff is past its size limit\n"
        else:
            part, work = _file_diff(rel, old, new, _mode(new_dir / rel if new is not None else old_dir / rel),
                                    work_left)
            work_left -= work
        parts.append(part)
        size += len(part)
    if unnamed:
        parts.append(f"# and {unnamed:,} more files differ, not named: the diff is past its size limit\n")
    return "".join(parts)


def diff_workspace(parent_dir: str | Path, ws_dir: str | Path) -> str:
    """What the session changed in the engine tree (reports/, peers/ and caches are not part of it)."""
    return diff_trees(parent_dir, ws_dir)
