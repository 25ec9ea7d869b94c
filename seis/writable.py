"""Whether a path a command will write can be written, found before the work rather than after it."""
from __future__ import annotations

import tempfile
from pathlib import Path


def unwritable(path: Path, what: str, is_dir: bool = True) -> str | None:
    """Why `what` at `path` (a directory, or a file when not is_dir) cannot be written, or None. Nothing is made or
    left: the nearest existing directory gets an unnamed temporary file, the only reliable test (root passes every
    os.access check)."""
    path = path.absolute()
    if path.exists() and path.is_dir() != is_dir:
        return f"{what} {path} exists and is {'not ' if is_dir else ''}a directory"
    where = path if is_dir else path.parent
    existing = next(p for p in [where, *where.parents] if p.exists())
    if not existing.is_dir():
        return f"{what} {path} cannot be created: {existing} is not a directory (not writable)"
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        return f"{what} {path} is not writable: {e.strerror}"
    return None
