"""Workspace confinement for the file tools: a model-supplied path either resolves inside the workspace or is
refused with a ToolError whose message goes back to the model (never raised out of the session)."""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from ...workspace import PEERS_DIR, REPORTS_DIR


class ToolError(Exception):
    """A tool call the model got wrong; its message is the tool result (is_error=True)."""


READ_ONLY_DIRS = (REPORTS_DIR, PEERS_DIR)  # session material: read it, don't rewrite it


def confine(root: Path, path: str, *, write: bool = False) -> Path:
    """The real path of `path` (relative to the workspace root), refusing anything that leaves the workspace."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string relative to the workspace root")
    if "\0" in path:
        raise ToolError("path contains a NUL byte")
    if os.path.isabs(path) or path.startswith("~"):
        raise ToolError(f"refused: {path!r} is absolute; paths are relative to the workspace root")
    parts = PurePosixPath(path.replace("\\", "/")).parts
    if ".." in parts:
        raise ToolError(f"refused: {path!r} contains '..'; paths must stay inside the workspace")
    real_root = root.resolve()
    target = (real_root / path).resolve()  # follows symlinks: a link out of the workspace is caught below
    if target != real_root and real_root not in target.parents:
        raise ToolError(f"refused: {path!r} resolves outside the workspace (a symlink leading out?)")
    rel = target.relative_to(real_root)
    if write and (not rel.parts or rel.parts[0] in READ_ONLY_DIRS):
        raise ToolError(f"refused: {path!r} is session material ({'/'.join(READ_ONLY_DIRS)}/ are read-only); "
                        "edit the engine tree")
    return target


def rel(root: Path, path: Path) -> str:
    """path relative to the workspace, as the model should write it (links are not followed)."""
    return Path(os.path.relpath(path, root.resolve())).as_posix()
