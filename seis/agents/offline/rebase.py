"""Carry the library's patches onto a changed E0: each patch was made against E0 at a git revision; its changes
are 3-way merged onto today's engine_template/ and written back as a patch against it.

    python -m seis.agents.offline.rebase --from REV [--names a,b]
    python -m seis.agents.offline.rebase --from-dir OLD_E0_DIR [--names a,b]

A transformation with prerequisites is a patch against E0 with them applied: it is carried after them, from old E0
with their old patches onto today's E0 with their carried ones. A transformation whose merge conflicts (or whose
prerequisite could not be carried) is left as it is and named on stderr: it must be redone by hand.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ...engine_import import ENGINE_TEMPLATE
from .library import LIBRARY_DIR, Transformation, load_library
from .merge import PatchError, _git, _patched, merge_file, patch_base, prerequisite_chain, with_prerequisites

REPO = ENGINE_TEMPLATE.parent


def _old_tree(rev: str, files: tuple[str, ...], dest: Path) -> Path:
    prefix = ENGINE_TEMPLATE.relative_to(REPO).as_posix()
    for rel in files:
        done = subprocess.run([_git(), "show", f"{rev}:{prefix}/{rel}"], cwd=REPO, capture_output=True)
        if done.returncode == 0:  # absent at rev: a file the patch creates
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(done.stdout)
    return dest


def unified_diff(base_dir: Path, files: dict[str, bytes]) -> str:
    """A patch from base_dir to `files` (rel -> new bytes), paths a/<rel> b/<rel>."""
    out = []
    with tempfile.TemporaryDirectory(prefix="seis-rebase-") as tmp:
        for rel, data in sorted(files.items()):
            for side, content in (("a", (base_dir / rel).read_bytes() if (base_dir / rel).is_file() else None),
                                  ("b", data)):
                if content is not None:
                    (Path(tmp) / side / rel).parent.mkdir(parents=True, exist_ok=True)
                    (Path(tmp) / side / rel).write_bytes(content)
            old = f"a/{rel}" if (base_dir / rel).is_file() else "/dev/null"
            done = subprocess.run([_git(), "diff", "--no-index", "--no-color", "--no-prefix", old, f"b/{rel}"],
                                  cwd=tmp, capture_output=True, text=True)
            if done.returncode > 1:
                raise RuntimeError(done.stderr)
            out += [line for line in done.stdout.splitlines(keepends=True) if not line.startswith("index ")]
    return "".join(out)


def rebase(t: Transformation, rev: str | None = None, old_dir: Path | None = None,
           carried_library: Path | None = None) -> str | None:
    """The patch carried onto today's E0 from E0 at git revision `rev` (or in `old_dir`); None on a conflict.

    t with prerequisites: its old base is old E0 with the prerequisites of t's own library applied, its new base
    today's E0 with those of `carried_library` (a library folder in which they are already carried)."""
    chain = prerequisite_chain(t)
    if chain and carried_library is None:
        raise ValueError(f"{t.name} is a patch against E0 with {', '.join(t.prerequisites)}: name the library "
                         "they were carried in")
    files = tuple(sorted({rel for x in chain + [t] for rel in x.target_files}))
    with tempfile.TemporaryDirectory(prefix="seis-rebase-old-") as tmp:
        old = Path(old_dir) if old_dir is not None else _old_tree(rev, files, Path(tmp))
        patched = _patched(patch_base(str(old), t), t.name, t.patch, t.target_files)
        new_base = ENGINE_TEMPLATE
        if chain:
            new_base = Path(patch_base(str(ENGINE_TEMPLATE),
                                       dataclasses.replace(t, path=Path(carried_library) / t.name)))
        new_files: dict[str, bytes] = {}
        for rel, (base, theirs) in patched.items():
            current = new_base / rel
            if base is None or not current.is_file():
                new_files[rel] = theirs
                continue
            merged, conflicts = merge_file(current.read_bytes(), base, theirs)
            if conflicts:
                return None
            new_files[rel] = merged
        return unified_diff(new_base, new_files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="rev", help="git revision of E0 the patches were made against")
    src.add_argument("--from-dir", type=Path, help="a copy of the E0 tree the patches were made against")
    ap.add_argument("--names", default="")
    args = ap.parse_args()
    names = {n for n in args.names.split(",") if n}
    library = load_library()
    order = [x for t in library for x in with_prerequisites(t)]  # each after its prerequisites
    order = [t for i, t in enumerate(order) if t not in order[:i]]
    failed = []
    with tempfile.TemporaryDirectory(prefix="seis-rebase-library-") as tmp:
        # Carried patches go here first: dependents are merged onto them while the library still holds the old
        # ones, their old base.
        carried = Path(tmp) / "library"
        shutil.copytree(LIBRARY_DIR, carried)
        for t in order:
            if names and t.name not in names:
                continue
            try:
                patch = rebase(t, args.rev, args.from_dir, carried)
            except PatchError:  # a prerequisite that is not carried onto today's E0
                patch = None
            if patch is None:
                failed.append(t.name)
            else:
                (carried / t.name / "patch.diff").write_text(patch, encoding="utf-8")
        for t in order:
            patch = (carried / t.name / "patch.diff").read_text(encoding="utf-8")
            if patch != t.patch:
                (t.path / "patch.diff").write_text(patch, encoding="utf-8")
                print(f"rebased {t.name}")
    if failed:
        print("conflicts (left unchanged, to redo by hand): " + ", ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
