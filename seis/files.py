"""Writing a file whole or not at all: a reader (a resume, a status poll, another worker) sees the old contents or
the new ones, never a file cut short by a process killed while it wrote."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to a temporary file beside `path` (a name of its own, so writers at once never share one), then
    rename it over `path`; the rename replaces a link at `path` rather than writing through it."""
    path = Path(path)
    fd, part = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(part, path)
    except BaseException:
        Path(part).unlink(missing_ok=True)
        raise
    return path
