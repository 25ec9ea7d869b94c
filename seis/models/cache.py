"""Where prepared models live, and how they are written so a half-written one is never used."""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .registry import ModelEntry

log = logging.getLogger(__name__)

# Written last, inside the temporary directory, so its presence in a model dir means "complete".
MARKER = ".seis-model.json"


def cache_dir() -> Path:
    """`$SEIS_CACHE` if set, else `~/.cache/seis` (read on every call so tests can redirect it)."""
    env = os.environ.get("SEIS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "seis"


def model_path(name: str) -> Path:
    return cache_dir() / "models" / name


def is_prepared(entry: ModelEntry) -> bool:
    try:
        marker = json.loads((model_path(entry.name) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("name") == entry.name and marker.get("version") == entry.version


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Serializes concurrent preparers of one model (e.g. parallel agents) so it is built only once.
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def materialize(entry: ModelEntry, force: bool = False) -> Path:
    """Build `entry` into the cache unless a complete copy exists; returns the model directory."""
    target = model_path(entry.name)
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{entry.name}.lock"):
        if not force and is_prepared(entry):
            return target
        # Holding the lock, any leftover temp dir of this model is from a crashed build.
        for stale in root.glob(f".{entry.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)

        log.info("preparing model %s into %s", entry.name, target)
        start = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=root))
        try:
            entry.build(tmp)
            (tmp / MARKER).write_text(json.dumps({"name": entry.name, "version": entry.version, "kind": entry.kind}))
            # mkdtemp (and safetensors) create private files; a shared cache should be readable like any other.
            tmp.chmod(0o755)
            for f in tmp.iterdir():
                f.chmod(0o644)
            if target.exists():  # forced rebuild or stale recipe: move the old copy aside, then swap in
                old = root / f".{entry.name}.tmp-old-{os.getpid()}"
                os.rename(target, old)
                os.rename(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        log.info("prepared %s in %.1fs", entry.name, time.monotonic() - start)
    return target
