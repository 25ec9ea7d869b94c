"""Just-in-time compile caches (Triton, FlashInfer) for engine sandboxes.

A trusted engine (the reference, vanilla E0) keeps one cache per machine, keyed by its tree, so its kernels are
compiled once rather than in every gate and post-validation. An untrusted engine gets a private directory seeded
with a copy of that cache: it is spared recompiling what the reference already built, and whatever it writes
there stays its own, never read by anything trusted.

Each sandbox runs as its own user and is given ownership of its writable cache, so one cache serves one running
engine at a time (held_cache): a trusted engine that finds the machine's cache taken, as when two gates run side
by side on one host, compiles into an empty directory of its own instead.
"""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def trusted_cache(tree_id: str) -> Path:
    """The reference's persistent cache for the engine tree `tree_id` (made if missing)."""
    from ..models.cache import cache_dir

    path = cache_dir() / "engine-cache" / tree_id[:16]
    path.mkdir(parents=True, exist_ok=True)
    return path


def private_cache(dest: Path, seed: Path | None) -> Path:
    """A fresh cache at `dest` (which must not exist) for an untrusted engine, holding a copy of `seed`."""
    if seed is not None and seed.is_dir():
        shutil.copytree(seed, dest, symlinks=True)
    else:
        dest.mkdir(parents=True)
    return dest


def seeded_cache(dest: Path, tree_id: str) -> Path:
    """A fresh cache at `dest` for an untrusted engine: a copy of the trusted cache of `tree_id` while no engine holds
    it, else empty (the engine running there may be writing half a kernel, which a copy would hand on as if whole).
    Make it before this process holds that cache for an engine of its own."""
    from ..store.lock import FileLock, LockTimeout

    path = trusted_cache(tree_id)
    try:
        with FileLock(_lock_path(path), timeout_s=0):
            return private_cache(dest, path)
    except LockTimeout:
        return private_cache(dest, None)


def _lock_path(cache: Path) -> Path:
    return cache.with_name(cache.name + ".lock")


@contextmanager
def held_cache(tree_id: str, spare: Path) -> Iterator[Path]:
    """The trusted cache for `tree_id` while no other engine holds it, else a new empty directory at `spare`;
    held until the block ends (keep the engine's whole life inside it)."""
    from ..store.lock import FileLock, LockTimeout

    path = trusted_cache(tree_id)
    lock = FileLock(_lock_path(path), timeout_s=0)
    try:
        lock.__enter__()
    except LockTimeout:
        yield private_cache(spare, None)
        return
    try:
        yield path
    finally:
        lock.__exit__(None, None, None)
