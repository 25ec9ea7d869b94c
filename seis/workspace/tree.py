"""An engine tree's files: which count, their hash, and copying them.

"The engine tree" is every regular file under a directory except caches (__pycache__, *.pyc, .git,
.pytest_cache) and, at the top level only, the session material SEIS puts beside the engine (reports/, peers/).
`tree_hash` is the one tree hash of SEIS (POSIX path, NUL, sha256 of the bytes, in sorted path order): the
workspace, the snapshot store and the evaluator (`seis.evaluator.snapshot.tree_sha256`) all call it, so a
snapshot id and the gate's hash of the same tree agree.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

IGNORED_DIRS = frozenset({"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
IGNORED_SUFFIXES = (".pyc", ".pyo")
SESSION_DIRS = frozenset({"reports", "peers"})  # top level only: session material, not engine code


class TreeError(ValueError):
    """The directory cannot be treated as an engine tree (missing, or a link leading outside it)."""


def _ignored(name: str) -> bool:
    return name in IGNORED_DIRS or name.endswith(IGNORED_SUFFIXES)


def tree_files(root: str | Path) -> list[str]:
    """Relative POSIX paths of the tree's files, sorted. In-tree symlinks count as what they point to."""
    root = Path(root)
    if not root.is_dir():
        raise TreeError(f"{root} is not a directory")
    real_root = root.resolve()
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        base = Path(dirpath)
        top = base == root
        dirnames[:] = sorted(d for d in dirnames if not _ignored(d) and not (top and d in SESSION_DIRS))
        for name in list(dirnames) + filenames:
            entry = base / name
            if entry.is_symlink():
                target = entry.resolve()
                if target != real_root and real_root not in target.parents:
                    raise TreeError(f"{entry.relative_to(root)} is a symlink leading outside {root}")
                here = base.resolve()
                if entry.is_dir() and (target == here or target in here.parents):
                    raise TreeError(f"{entry.relative_to(root)} is a symlink to its own ancestor (a loop)")
        for f in filenames:
            if not _ignored(f) and not (base / f).is_file():  # a FIFO, socket or device would block a read
                raise TreeError(f"{(base / f).relative_to(root)} is not a regular file")
        out += [(base / f).relative_to(root).as_posix() for f in filenames if not _ignored(f)]
    return sorted(out)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_hash(root: str | Path) -> str:
    """sha256 over the sorted relative paths and file bytes of the engine tree (hex)."""
    root = Path(root)
    h = hashlib.sha256()
    for rel in tree_files(root):
        h.update(rel.encode("utf-8") + b"\0")
        h.update(bytes.fromhex(file_sha256(root / rel)))
    return h.hexdigest()


def copy_tree(src: str | Path, dest: str | Path) -> list[str]:
    """Copy the engine tree of src into dest (created; must not hold files). Links become plain files."""
    src, dest = Path(src), Path(dest)
    files = tree_files(src)
    if dest.exists() and any(dest.iterdir()):
        raise TreeError(f"{dest} already exists and is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, target)  # copy2: content and mode (and mtime) kept
    return files
