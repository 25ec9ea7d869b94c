"""Which code a benchmark measured: the commit, and whether the checkout differed from it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def source_commit(repo: Path = PROJECT) -> str:
    """The short commit of the checkout, with "+changes" when tracked files differ from it or files git does not
    ignore were added: a figure then names the commit it started from and says the code that ran was not that
    commit. SEIS_COMMIT, set where the tree was copied without its .git, is taken as it is; "unknown" without
    either."""
    if os.environ.get("SEIS_COMMIT"):
        return os.environ["SEIS_COMMIT"]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("+changes" if git("status", "--porcelain") else "")
