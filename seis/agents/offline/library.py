"""The offline agent's transformation library: one directory per transformation, kept outside the engine.

    library/<name>/meta.yaml   name, rationale, expected_effect, target_files
                               (+ gpu_only, numerics, verified, prerequisites, supersedes, expected_speedup)
    library/<name>/patch.diff  a unified diff against E0 (engine_template/) with the prerequisites applied,
                               paths a/<file> b/<file>
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

LIBRARY_DIR = Path(__file__).resolve().parent / "library"
_PATCH_FILE = re.compile(r"^\+\+\+ b/(\S+)$|^--- a/(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Transformation:
    name: str
    rationale: str
    expected_effect: str
    target_files: tuple[str, ...]
    patch: str
    gpu_only: bool = False         # the changed code runs only on CUDA (CPU tests exercise only its import)
    numerics: str = "identical"    # how outputs compare with E0's
    verified: str = ""             # what was checked, where
    prerequisites: tuple[str, ...] = ()  # transformations that must already be in the engine
    supersedes: tuple[str, ...] = ()     # transformations this one replaces (they are not tried once it is in)
    # The agent's prior: the single-request speedup it brings where it applies (measured where the meta says).
    expected_speedup: float = 1.0
    path: Path | None = None

    def describe(self) -> str:
        return f"`{self.name}`: {self.rationale.strip()} ({', '.join(self.target_files)})"


def _read_meta(d: Path) -> dict:
    """The meta file's mapping; ValueError naming the file where it is no YAML (JSON) or not a mapping: a typo in
    one meta.yaml of an operator's library ended `seis evolve --agent-library` in a YAML traceback."""
    import yaml  # lazy: only libraries with YAML metadata need it
    for name, parse in (("meta.yaml", yaml.safe_load), ("meta.json", json.loads)):
        if (d / name).is_file():
            try:
                meta = parse((d / name).read_text(encoding="utf-8"))
            except (yaml.YAMLError, ValueError) as e:  # JSON's and UTF-8's errors are ValueErrors
                raise ValueError(f"{d / name} cannot be read: {' '.join(str(e).split())}") from None
            if meta is None:
                return {}
            if not isinstance(meta, dict):
                raise ValueError(f"{d / name} holds a {type(meta).__name__}, not a mapping of name, rationale, "
                                 f"expected_effect, target_files")
            return meta
    raise ValueError(f"{d} has neither meta.yaml nor meta.json")


def load_transformation(d: Path) -> Transformation:
    meta = _read_meta(d)
    missing = [k for k in ("name", "rationale", "expected_effect", "target_files") if k not in meta]
    if missing:
        raise ValueError(f"{d}: meta lacks {', '.join(missing)}")
    if meta["name"] != d.name:
        raise ValueError(f"{d}: meta name {meta['name']!r} differs from its directory name")
    patch_path = d / "patch.diff"
    if not patch_path.is_file():
        raise ValueError(f"{d}: no patch.diff")
    patch = patch_path.read_text(encoding="utf-8")
    in_patch = sorted({a or b for a, b in _PATCH_FILE.findall(patch)})
    targets = tuple(sorted(meta["target_files"]))
    if list(targets) != in_patch:
        raise ValueError(f"{d}: target_files {list(targets)} differ from the files the patch touches {in_patch}")
    speedup = meta.get("expected_speedup", 1.0)
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not speedup > 0:
        raise ValueError(f"{d}: expected_speedup must be a positive number, not {speedup!r}")
    return Transformation(meta["name"], meta["rationale"], meta["expected_effect"], targets, patch,
                          bool(meta.get("gpu_only", False)), str(meta.get("numerics", "identical")),
                          str(meta.get("verified", "")), _names(meta, "prerequisites", d),
                          _names(meta, "supersedes", d), float(speedup), path=d)


def _names(meta: dict, key: str, d: Path) -> tuple[str, ...]:
    value = meta.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{d}: {key} must be a list of transformation names")
    return tuple(sorted(value))


def load_library(root: str | Path = LIBRARY_DIR) -> tuple[Transformation, ...]:
    """Every transformation under root, sorted by name (the base of every deterministic order)."""
    root = Path(root)
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    library = tuple(load_transformation(d) for d in dirs)
    known = {t.name for t in library}
    for t in library:
        unknown = sorted((set(t.prerequisites) | set(t.supersedes)) - known)
        if unknown:
            raise ValueError(f"{t.path}: names transformations not in the library: {', '.join(unknown)}")
    return library
