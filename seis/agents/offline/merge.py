"""Apply a library transformation onto a workspace by a 3-way merge per target file.

base = E0's file, theirs = E0's file with the patch applied, ours = the workspace's file. `git merge-file` keeps
the workspace's other changes; a conflict means the transformation does not fit this engine any more.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .library import Transformation

Outcome = Literal["applied", "present", "conflict", "error"]


class PatchError(RuntimeError):
    """A library patch does not apply to its base (the library entry is broken)."""


def _git() -> str:
    git = shutil.which("git")
    if git is None:
        raise RuntimeError("the offline agent needs git (git apply, git merge-file) on PATH")
    return git


@functools.lru_cache(maxsize=64)
def _patched(base_dir: str, name: str, patch: str, targets: tuple[str, ...]) -> dict[str, tuple[bytes | None, bytes]]:
    """{file: (base bytes or None if the patch creates it, patched bytes)} -- E0 + patch, computed once."""
    base = Path(base_dir)
    with tempfile.TemporaryDirectory(prefix="seis-patch-") as tmp:
        work = Path(tmp)
        for rel in targets:
            if (base / rel).is_file():
                (work / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(base / rel, work / rel)
        (work / "patch.diff").write_text(patch, encoding="utf-8")
        # The ceiling keeps git from finding an enclosing repository (inside one, git apply would resolve paths
        # against that repository's root and skip ours).
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(work.parent)}
        env.pop("GIT_DIR", None)
        done = subprocess.run([_git(), "apply", "--whitespace=nowarn", "patch.diff"], cwd=work,
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise PatchError(f"transformation {name!r} does not apply to its base {base}: {done.stderr.strip()}")
        return {rel: ((base / rel).read_bytes() if (base / rel).is_file() else None, (work / rel).read_bytes())
                for rel in targets}


def merge_file(ours: bytes, base: bytes, theirs: bytes) -> tuple[bytes, int]:
    """(merged bytes, number of conflicts) by `git merge-file -p` (no files are changed)."""
    with tempfile.TemporaryDirectory(prefix="seis-merge-") as tmp:
        paths = []
        for label, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            p = Path(tmp) / label
            p.write_bytes(data)
            paths.append(str(p))
        done = subprocess.run([_git(), "merge-file", "-p", "-L", "workspace", "-L", "E0", "-L", "transformation",
                               *paths], capture_output=True)
    if done.returncode < 0 or done.returncode > 127:
        raise RuntimeError(f"git merge-file failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout, done.returncode


@dataclass(frozen=True)
class MergeResult:
    outcome: Outcome
    files: dict[str, bytes] = field(default_factory=dict)   # merged contents (outcome "applied")
    detail: str = ""


def merge_transformation(tree: str | Path, base_dir: str | Path, t: Transformation) -> MergeResult:
    """What applying t onto tree would give, without writing anything."""
    tree = Path(tree)
    try:
        patched = _patched(str(Path(base_dir).resolve()), t.name, t.patch, t.target_files)
    except PatchError as e:
        return MergeResult("error", detail=str(e))
    merged: dict[str, bytes] = {}
    conflicts = []
    for rel, (base, theirs) in patched.items():
        target = tree / rel
        if not target.is_file():
            if base is None:  # a file the transformation creates
                merged[rel] = theirs
                continue
            return MergeResult("conflict", detail=f"{rel} is missing from the workspace")
        ours = target.read_bytes()
        out, n = merge_file(ours, base if base is not None else b"", theirs)
        if n:
            conflicts.append(f"{rel} ({n} conflicting hunk{'s' if n > 1 else ''})")
        merged[rel] = out
    if conflicts:
        return MergeResult("conflict", detail="merge conflict in " + ", ".join(conflicts))
    if all((tree / rel).is_file() and (tree / rel).read_bytes() == data for rel, data in merged.items()):
        return MergeResult("present", detail="already in the engine")
    return MergeResult("applied", merged)


def apply_transformation(tree: str | Path, base_dir: str | Path, t: Transformation) -> MergeResult:
    """Merge t into tree and write the result; all target files or none."""
    result = merge_transformation(tree, base_dir, t)
    if result.outcome == "applied":
        for rel, data in result.files.items():
            path = Path(tree) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return result


def is_present(tree: str | Path, base_dir: str | Path, t: Transformation) -> bool:
    return merge_transformation(tree, base_dir, t).outcome == "present"
