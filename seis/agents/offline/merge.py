"""Apply a library transformation onto a workspace by a 3-way merge per target file.

base = the file the patch was made against, theirs = that file with the patch applied, ours = the workspace's
file. `git merge-file` keeps the workspace's other changes; a conflict means the transformation does not fit this
engine any more. A transformation without prerequisites is a patch against E0; one with prerequisites is a patch
against E0 with its prerequisites applied (the files they create or change are its base), so it can build on
them and still merge into any engine that holds them, whatever else that engine has.
"""
from __future__ import annotations

import atexit
import difflib
import functools
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...workspace.tree import TreeError, read_tree_file, tree_files
from .library import Transformation, load_library

Outcome = Literal["applied", "present", "conflict", "error"]


class PatchError(RuntimeError):
    """A library patch does not apply to its base (the library entry is broken)."""


class MergeError(RuntimeError):
    """git merge-file cannot merge these files (a binary one: a NUL byte in its first 8,000)."""


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


def prerequisite_chain(t: Transformation) -> list[Transformation]:
    """t's prerequisites and theirs, each after what it needs (from t's library)."""
    if not t.prerequisites:
        return []
    if t.path is None:
        raise PatchError(f"transformation {t.name!r} has prerequisites but no library to find them in")
    library = {x.name: x for x in load_library(t.path.parent)}
    order: list[Transformation] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise PatchError(f"prerequisites of {t.name!r} form a cycle: {' -> '.join(path + (name,))}")
        if name not in library:
            raise PatchError(f"{t.name!r} needs {name!r}, which is not in its library")
        if any(x.name == name for x in order):
            return
        for p in library[name].prerequisites:
            visit(p, path + (name,))
        order.append(library[name])

    for p in t.prerequisites:
        visit(p, (t.name,))
    return order


def with_prerequisites(t: Transformation) -> list[Transformation]:
    """What to apply onto E0, in order, to have t: its prerequisite chain, then t."""
    return prerequisite_chain(t) + [t]


def patch_base(base_dir: str, t: Transformation) -> str:
    """The tree t's patch applies to: base_dir itself, or (with prerequisites) the files t and its prerequisites
    touch, copied from base_dir with the prerequisites applied in order (a folder kept until the process ends)."""
    chain = prerequisite_chain(t)
    return _with_applied(base_dir, tuple(chain), t.target_files) if chain else base_dir


@functools.lru_cache(maxsize=32)
def _with_applied(base_dir: str, chain: tuple[Transformation, ...], targets: tuple[str, ...]) -> str:
    tree = Path(_patch_base_dir())
    for rel in sorted({rel for x in chain for rel in x.target_files} | set(targets)):
        if (Path(base_dir) / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(base_dir) / rel, tree / rel)
    for p in chain:
        result = apply_transformation(tree, base_dir, p)
        if result.outcome != "applied":
            raise PatchError(f"prerequisite {p.name!r} does not apply to {base_dir}: {result.outcome} {result.detail}")
    return str(tree)


def _patch_base_dir() -> str:
    path = tempfile.mkdtemp(prefix="seis-patch-base-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


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
        why = done.stderr.decode(errors="replace").strip().replace(tmp + "/", "")[:300]
        raise MergeError(f"git merge-file failed: {why}")
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
        patched = _patched(patch_base(str(Path(base_dir).resolve()), t), t.name, t.patch, t.target_files)
    except PatchError as e:
        return MergeResult("error", detail=str(e))
    try:  # the workspace's target files, read once; a link or special file anywhere in it is refused, not followed
        files = set(tree_files(tree))
        ours = {rel: read_tree_file(tree, rel) if rel in files else None for rel in patched}
    except TreeError as e:
        return MergeResult("conflict", detail=str(e))
    merged: dict[str, bytes] = {}
    conflicts = []
    for rel, (base, theirs) in patched.items():
        if ours[rel] is None:
            if base is None and (why := _in_the_way(tree, rel)) is None:  # a file the transformation creates
                merged[rel] = theirs
                continue
            return MergeResult("conflict", detail=why if base is None else f"{rel} is missing from the workspace")
        try:
            out, n = merge_file(ours[rel], base if base is not None else b"", theirs)
        except MergeError as e:
            return MergeResult("conflict", detail=f"{rel}: {e}")
        if n:
            conflicts.append(f"{rel} ({n} conflicting hunk{'s' if n > 1 else ''})")
        merged[rel] = out
    if conflicts:
        if all(_holds_additions(ours[rel] or b"", base, theirs) for rel, (base, theirs) in patched.items()):
            return MergeResult("present", detail="already in the engine (beside other changes)")
        return MergeResult("conflict", detail="merge conflict in " + ", ".join(conflicts))
    if all(ours[rel] == data for rel, data in merged.items()):
        return MergeResult("present", detail="already in the engine")
    return MergeResult("applied", merged)


def _in_the_way(tree: Path, rel: str) -> str | None:
    """What keeps a file the transformation creates from being written at rel in tree (a tree whose walk found no
    link): a directory or anything else at rel, or a file where one of its directories goes. None: nothing."""
    path = tree
    for part in Path(rel).parts:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        if path != tree / rel and not stat.S_ISDIR(mode):
            return f"{path.relative_to(tree).as_posix()} is a file where {rel} needs a directory"
    return f"{rel} is already there and is not a file the transformation can create"


def _holds_additions(ours: bytes, base: bytes | None, theirs: bytes) -> bool:
    """Whether ours holds, in order, every block of lines that base -> theirs adds or rewrites.

    A 3-way merge also conflicts where the transformation is in the engine already but another change sits right
    beside it: diff aligns the two changes into one hunk, or matches lines the other change repeats. A
    transformation that only deletes lines is never taken for present this way."""
    old, new, have = (base or b"").splitlines(True), theirs.splitlines(True), ours.splitlines(True)
    blocks = [new[j1:j2] for tag, _, _, j1, j2 in
              difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if tag in ("replace", "insert")]
    at = 0
    for block in blocks:
        at = next((i + len(block) for i in range(at, len(have) - len(block) + 1)
                   if have[i : i + len(block)] == block), -1)
        if at < 0:
            return False
    return bool(blocks)


def apply_transformation(tree: str | Path, base_dir: str | Path, t: Transformation) -> MergeResult:
    """Merge t into tree and write the result: all target files or none (short of a failure between renames)."""
    result = merge_transformation(tree, base_dir, t)
    if result.outcome != "applied":
        return result
    staged: list[tuple[str, Path]] = []
    try:  # every file written beside its target first, then renamed over it: a failure midway changes nothing
        for rel, data in result.files.items():
            path = Path(tree) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, part = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
            staged.append((part, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            try:  # an existing file keeps its mode (an executable stays one)
                st = os.lstat(path)
                mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644
            except FileNotFoundError:
                mode = 0o644
            os.chmod(part, mode)
        for part, path in staged:  # a rename replaces a link put at the path since the merge, never writes through
            os.replace(part, path)
    except BaseException:
        for part, _ in staged:
            Path(part).unlink(missing_ok=True)
        raise
    return result


def is_present(tree: str | Path, base_dir: str | Path, t: Transformation) -> bool:
    return merge_transformation(tree, base_dir, t).outcome == "present"


def present_in(tree: str | Path, base_dir: str | Path, library: dict[str, Transformation]) -> set[str]:
    """Names of the library's transformations in tree: those whose merge changes nothing, and the prerequisites
    of those (a dependent may have edited a file its prerequisite created, which then no longer merges as
    unchanged on its own)."""
    present = {n for n, t in library.items() if is_present(tree, base_dir, t)}
    return present | {p.name for n in present for p in prerequisite_chain(library[n])}
