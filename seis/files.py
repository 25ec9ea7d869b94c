"""Writing a file whole or not at all: a reader (a resume, a status poll, another worker) sees the old contents or
the new ones, never a file cut short by a process killed while it wrote."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path


def write_atomic(path: Path, text: str, mode: int | None = None) -> Path:
    """Write `text` to a temporary file beside `path` (a name of its own, so writers at once never share one), then
    rename it over `path`; the rename replaces a link at `path` rather than writing through it. The file gets `mode`,
    else what open() gives a new file (0666 less the umask): mkstemp's 0600 kept a run's status, outcomes and best
    engine from every other user, who could read its config and reports."""
    path = Path(path)
    fd, part = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        os.fchmod(fd, mode if mode is not None else 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(part, path)
    except BaseException:
        Path(part).unlink(missing_ok=True)
        raise
    return path


def set_aside(path: Path) -> Path:
    """Rename a file that cannot be read as what it should hold (a hand edit, a disk fault) to
    `<name>.unreadable-<time>` beside it, so that what replaces it loses nothing of it. Returns the new path."""
    path, stamp, n = Path(path), time.strftime("%Y%m%dT%H%M%S"), 0
    kept = path.with_name(f"{path.name}.unreadable-{stamp}")
    while kept.exists():  # one set aside earlier within the same second
        n += 1
        kept = path.with_name(f"{path.name}.unreadable-{stamp}-{n}")
    os.replace(path, kept)
    return kept


def _umask() -> int:
    """This process's umask, read without setting it (os.umask sets it, for every thread, while it reads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
