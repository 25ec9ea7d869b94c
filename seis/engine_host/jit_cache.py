"""Just-in-time compile caches (Triton, FlashInfer) for engine sandboxes.

A trusted engine (the reference, vanilla E0) keeps one cache per machine, keyed by its tree, so its kernels are
compiled once rather than in every gate and post-validation. An untrusted engine gets a private directory seeded
with a copy of that cache: it is spared recompiling what the reference already built, and whatever it writes
there stays its own, never read by anything trusted.
"""
from __future__ import annotations

import shutil
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
