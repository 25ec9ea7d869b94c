"""Validate an engine directory, hash it, and copy it somewhere it cannot change while it is evaluated.

The tree hash is the one of `seis.workspace.tree` (sorted relative paths and file bytes; caches, VCS metadata and
the session material beside the engine, reports/ and peers/, are not the engine): what the gate judges and what
the store keeps hash alike. A symlink inside the tree counts as the file it points to (and is copied as that file).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..workspace.tree import IGNORED_DIRS, IGNORED_SUFFIXES, TreeError, tree_files, tree_hash
from .errors import GateInputError

# Files Python (or pytest) would execute on its own if they sat on sys.path / in a site dir.
FORBIDDEN_FILES = frozenset({"sitecustomize.py", "usercustomize.py", "conftest.py"})


@dataclass(frozen=True)
class Snapshot:
    source: Path   # the directory that was validated
    path: Path     # the private copy the engine process runs from
    sha256: str


def _ignored(name: str) -> bool:
    return name in IGNORED_DIRS or name.endswith(IGNORED_SUFFIXES)


def _files(root: Path) -> list[Path]:
    """The engine tree's files (following in-tree directory symlinks), relative, sorted by POSIX path."""
    try:
        return [Path(rel) for rel in tree_files(root)]
    except TreeError as e:
        raise GateInputError(f"{root} cannot be judged as an engine tree: {e}") from None


def validate_engine_tree(root: str | Path, what: str = "candidate", max_bytes: float = float("inf")) -> Path:
    """The resolved directory, or GateInputError naming the first reason it cannot be evaluated."""
    path = Path(root).expanduser()
    if not path.is_dir():
        raise GateInputError(f"{what} dir {path} does not exist or is not a directory")
    path = path.resolve()
    if not (path / "engine" / "__init__.py").is_file():
        raise GateInputError(f"{what} dir {path} has no engine package (engine/__init__.py); "
                             f"it must follow engine_template/CONTRACT.md")
    if (path / "seis").exists() or (path / "seis.py").exists():
        raise GateInputError(f"{what} dir {path} ships its own 'seis' module, which could shadow the evaluator; "
                             f"remove it")
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):  # not following links: each link is checked here
        dirnames[:] = [d for d in dirnames if not _ignored(d)]
        base = Path(dirpath)
        for name in dirnames + filenames:
            entry = base / name
            rel = entry.relative_to(path)
            if entry.is_symlink():
                target = entry.resolve()
                if target != path and path not in target.parents:
                    raise GateInputError(f"{what} dir {path}: symlink {rel} points outside it (to {target})")
                if target.is_dir() and (target == path or target in entry.parents):
                    raise GateInputError(f"{what} dir {path}: symlink {rel} points to its own ancestor (a loop)")
            if name in FORBIDDEN_FILES or name.endswith(".pth"):
                raise GateInputError(f"{what} dir {path}: {rel} is not allowed (Python or pytest would run it "
                                     f"implicitly); remove it")
            if entry.is_file() and not entry.is_symlink():
                total += entry.stat().st_size
        if total > max_bytes:
            raise GateInputError(f"{what} dir {path} is larger than {max_bytes / 2**20:.0f} MiB")
    return path


def tree_sha256(root: str | Path) -> str:
    """The engine tree's hash: the same function the workspace and the snapshot store use."""
    try:
        return tree_hash(root)
    except TreeError as e:
        raise GateInputError(f"{root} cannot be hashed as an engine tree: {e}") from None


def files_sha256(paths: list[Path], root: Path) -> str:
    """Hash of specific files (e.g. the evaluator's own source), named relative to root."""
    h = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
        h.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def snapshot(root: str | Path, dest: Path, what: str = "candidate", max_bytes: float = float("inf")) -> Snapshot:
    """Validate root, copy it to dest (which must not exist), and hash the copy (what actually runs)."""
    source = validate_engine_tree(root, what, max_bytes)
    dest.mkdir(parents=True)
    for rel in _files(source):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target)  # follows in-tree links: the copy holds plain files only
    return Snapshot(source=source, path=dest, sha256=tree_sha256(dest))
