"""Validate an engine directory, hash it, and copy it somewhere it cannot change while it is evaluated.

The tree hash is the one of `seis.workspace.tree` (sorted relative paths and file bytes; caches, VCS metadata and
the session material beside the engine, reports/ and peers/, are not the engine): what the gate judges and what
the store keeps hash alike. A symlink or special file anywhere in the tree is refused, never followed.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..workspace.tree import TreeError, copy_tree, is_control_file, tree_files, tree_hash
from .errors import GateInputError

# Files Python (or pytest) would execute on its own if they sat on sys.path / in a site dir.
FORBIDDEN_FILES = frozenset({"sitecustomize.py", "usercustomize.py", "conftest.py"})


@dataclass(frozen=True)
class Snapshot:
    source: Path   # the directory that was validated
    path: Path     # the private copy the engine process runs from
    sha256: str


def _refuse_own_seis(path: Path, what: str) -> None:
    if os.path.lexists(path / "seis") or os.path.lexists(path / "seis.py"):
        raise GateInputError(f"{what} dir {path} ships its own 'seis' module, which could shadow the evaluator; "
                             f"remove it")


def validate_engine_tree(root: str | Path, what: str = "candidate", max_bytes: float = float("inf"),
                         shown: Path | None = None) -> Path:
    """The resolved directory, or GateInputError naming the first reason it cannot be evaluated. For a tree that
    may still change (an agent's), validate the private copy that `snapshot` makes, not the source; `shown`: the
    directory messages name (the source the operator passed, not a private copy of it)."""
    path = Path(root).expanduser()
    if not path.is_dir():
        raise GateInputError(f"{what} dir {shown or path} does not exist or is not a directory")
    path = path.resolve()
    named = shown or path
    try:
        files = tree_files(path)  # refuses links and special files anywhere in the tree
    except TreeError as e:
        raise GateInputError(f"{what} dir {named} cannot be judged as an engine tree: {e}") from None
    if "engine/__init__.py" not in files:
        raise GateInputError(f"{what} dir {named} has no engine package (engine/__init__.py); "
                             f"it must follow engine_template/CONTRACT.md")
    _refuse_own_seis(path, what)
    total = 0
    for rel in files:
        name = rel.rsplit("/", 1)[-1]
        if name in FORBIDDEN_FILES or name.endswith(".pth"):
            raise GateInputError(f"{what} dir {named}: {rel} is not allowed (Python or pytest would run it "
                                 f"implicitly); remove it")
        if any(is_control_file(part) for part in rel.split("/")):
            raise GateInputError(f"{what} dir {named}: {rel} is a version-control or DVC file, which an engine "
                                 f"tree may not hold; remove it")
        total += os.lstat(path / rel).st_size
        if total > max_bytes:
            raise GateInputError(f"{what} dir {named} is larger than {max_bytes / 2**20:.0f} MiB")
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
    """Copy root to dest (which must not exist) without following any link, then validate and hash the copy:
    what is judged and run is the private copy, whatever the source does meanwhile."""
    source = Path(root).expanduser()
    if not source.is_dir():
        raise GateInputError(f"{what} dir {source} does not exist or is not a directory")
    source = source.resolve()
    _refuse_own_seis(source, what)
    dest.mkdir(parents=True)
    try:
        copy_tree(source, dest, max_total_bytes=max_bytes)
    except TreeError as e:
        raise GateInputError(f"{what} dir {source} cannot be judged as an engine tree: {e}") from None
    validate_engine_tree(dest, what, max_bytes, shown=source)
    return Snapshot(source=source, path=dest, sha256=tree_sha256(dest))
