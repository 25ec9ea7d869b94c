"""DVC through its command line (never its internals), serialized per repository by a file lock."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .lock import FileLock

LOCK_NAME = "seis-dvc.lock"  # under .dvc/tmp/ (ignored by git and DVC)


class DvcError(RuntimeError):
    pass


def dvc_command() -> list[str] | None:
    """How to run DVC here: this interpreter's module if installed, else a `dvc` on PATH, else None."""
    if importlib.util.find_spec("dvc") is not None:
        return [sys.executable, "-m", "dvc"]
    exe = shutil.which("dvc")
    return [exe] if exe else None


def find_dvc_root(path: str | Path) -> Path | None:
    """The nearest directory at or above path holding a .dvc/ directory."""
    p = Path(path).resolve()
    for d in (p, *p.parents):
        if (d / ".dvc").is_dir():
            return d
    return None


@dataclass(frozen=True)
class DvcRepo:
    root: Path
    command: tuple[str, ...]
    lock_timeout_s: float = 600.0

    def run(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "DVC_NO_ANALYTICS": "1"}  # no network calls from a library
        with FileLock(self.root / ".dvc" / "tmp" / LOCK_NAME, self.lock_timeout_s):
            done = subprocess.run([*self.command, *args], cwd=cwd or self.root, capture_output=True, text=True,
                                  env=env)
        if check and done.returncode != 0:
            raise DvcError(f"`dvc {' '.join(args)}` failed in {cwd or self.root}: "
                           f"{(done.stderr or done.stdout).strip()}")
        return done

    def add(self, target: Path) -> Path:
        """Track target (a directory); returns its .dvc file."""
        self.run("add", target.name, cwd=target.parent)
        return target.parent / f"{target.name}.dvc"

    def checkout(self, dvc_file: Path) -> None:
        self.run("checkout", dvc_file.name, cwd=dvc_file.parent)

    def default_remote(self) -> str | None:
        """The repository's default remote ('' / None when none is configured)."""
        done = self.run("remote", "default", check=False)
        return done.stdout.strip() or None if done.returncode == 0 else None

    def remote_url(self) -> str | None:
        """The default remote's URL as DVC resolves it (None when there is no default remote)."""
        done = self.run("remote", "list", check=False)
        for line in done.stdout.splitlines() if done.returncode == 0 else ():
            name, _, rest = line.strip().partition("\t") if "\t" in line else line.strip().partition(" ")
            if rest.strip().endswith("(default)"):
                url = rest.strip().removesuffix("(default)").strip()
                if not re.match(r"^[a-z0-9+]+://", url) and not Path(url).is_absolute():
                    url = str((self.root / ".dvc" / url).resolve())  # relative URLs are relative to .dvc/
                return url or None
        return None

    def push(self, dvc_file: Path) -> None:
        """Push to the default remote. Pushes to a local-directory remote (a shared filesystem, other clones and
        hosts writing to it too) are serialised by a lock file in it, so that no two repositories write at once."""
        if not hasattr(self, "_push_lock"):
            url = self.remote_url()
            local = url is not None and (url.startswith("file://") or not re.match(r"^[a-z0-9+]+://", url))
            object.__setattr__(self, "_push_lock",
                               Path(url.removeprefix("file://")) / ".seis-push.lock" if local else None)
        lock = self._push_lock
        if lock is None:
            self.run("push", dvc_file.name, cwd=dvc_file.parent)
            return
        with FileLock(lock, self.lock_timeout_s):
            self.run("push", dvc_file.name, cwd=dvc_file.parent)

    def pull(self, dvc_file: Path) -> None:
        self.run("pull", dvc_file.name, cwd=dvc_file.parent)

    def status(self, dvc_file: Path) -> str:
        return self.run("status", dvc_file.name, cwd=dvc_file.parent).stdout


def open_repo(path: str | Path, lock_timeout_s: float = 600.0) -> DvcRepo | None:
    """The DVC repository containing path, if there is one and DVC can be run."""
    root, command = find_dvc_root(path), dvc_command()
    if root is None or command is None:
        return None
    return DvcRepo(root, tuple(command), lock_timeout_s)
