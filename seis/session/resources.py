"""What a run holds outside its run directory, written down so that someone else can let go of it when the run's
process cannot (cancelled, crashed, killed): GPU-slot leases and the run's scratch directory.

    <registry>/leases/<lease-id>.json     {lease_id, flow_run_id, label, pid, started, api}
    <registry>/runs/<flow-run-id>.json    {run_dir, scratch, pid}

A lease whose process is gone (on this host) is stale: the next run releases it at once instead of waiting
for the orchestrator's lease to expire. Nothing here talks to Prefect; tasks/gpu.py does.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files import write_atomic
from ..workspace.tree import TreeError, remove_tree


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat): a pid reused later differs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Lease:
    lease_id: str
    flow_run_id: str
    label: str
    pid: int
    started: str | None
    api: str

    @property
    def alive(self) -> bool:
        return self.started is not None and _proc_start(self.pid) == self.started


@dataclass(frozen=True)
class RunResources:
    run_dir: str
    scratch: str
    pid: int


class Registry:
    def __init__(self, root: Path):
        self.root = Path(root)

    # ---- leases ------------------------------------------------------------------------------------------------
    def add_lease(self, lease_id: str, flow_run_id: str, label: str, api: str) -> Lease:
        lease = Lease(str(lease_id), str(flow_run_id), label, os.getpid(), _proc_start(os.getpid()), api)
        _write(self.root / "leases" / f"{lease.lease_id}.json", asdict(lease))
        return lease

    def drop_lease(self, lease_id: str) -> None:
        (self.root / "leases" / f"{lease_id}.json").unlink(missing_ok=True)

    def leases(self, api: str | None = None) -> list[Lease]:
        out = []
        for path in sorted((self.root / "leases").glob("*.json")):
            try:
                lease = Lease(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            if api is None or lease.api == api:
                out.append(lease)
        return out

    def stale_leases(self, api: str) -> list[Lease]:
        """Leases on this API whose holding process no longer exists."""
        return [lease for lease in self.leases(api) if not lease.alive]

    def leases_of(self, flow_run_id: str, api: str) -> list[Lease]:
        return [lease for lease in self.leases(api) if lease.flow_run_id == str(flow_run_id)]

    # ---- runs --------------------------------------------------------------------------------------------------
    def add_run(self, flow_run_id: str, run_dir: Path, scratch: Path) -> None:
        _write(self.root / "runs" / f"{flow_run_id}.json",
               asdict(RunResources(str(run_dir), str(scratch), os.getpid())))

    def run(self, flow_run_id: str) -> RunResources | None:
        try:
            return RunResources(**json.loads((self.root / "runs" / f"{flow_run_id}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def drop_run(self, flow_run_id: str) -> None:
        (self.root / "runs" / f"{flow_run_id}.json").unlink(missing_ok=True)


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data) + "\n")


# ---- the run's scratch directory ----------------------------------------------------------------------------------
def run_scratch_path(run_dir: Path) -> Path:
    """Where a run's temporary files go (gate copies, engine logs): one directory per run directory, outside it
    (the engine sandbox never shows the checkout, where runs/ usually lies), removed when the run ends and, if
    its process was killed, by the next attempt."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    base = Path(tempfile.gettempdir())
    if base.name.startswith("seis-run-"):  # asked from inside a run's scratch
        base = base.parent
    return base / f"seis-run-{digest}"


def remove_scratch(path: Path) -> None:
    """Best effort, as the run's end, its crash or cancel hook and the next attempt's start must not fail on it: a
    scratch dir holds what sandboxed engines wrote (their caches), so it is removed as hostile input (remove_tree:
    no link followed, no recursion, whatever its depth)."""
    try:
        remove_tree(path)
    except (OSError, TreeError):
        pass


_scratch_lock = threading.Lock()
_active: list[Path] = []     # scratch dirs of the runs now working in this process, in the order they began
_finished: list[Path] = []   # ended runs' dirs, removed once no run of this process is working
_original_tempdir: str | None = None


@contextlib.contextmanager
def scratch(run_dir: Path):
    """Send every `tempfile` directory of this process under the run's scratch dir while the run works, and
    remove it afterwards (also what an interrupted attempt left there). Runs may overlap in one process (threads):
    `tempfile` then points at the latest one still working, and since a run's files can lie in another run's dir,
    the dirs of ended runs are removed only when no run of the process is left working."""
    global _original_tempdir
    root = run_scratch_path(run_dir)
    with _scratch_lock:
        if not _active:
            _original_tempdir = tempfile.tempdir
        if root in _finished:  # ended earlier in this process, possibly holding other runs' files: keep it
            _finished.remove(root)
        else:
            remove_scratch(root)
        root.mkdir(parents=True, exist_ok=True)
        _active.append(root)
        tempfile.tempdir = str(root)
    try:
        yield root
    finally:
        with _scratch_lock:
            _active.remove(root)
            _finished.append(root)
            tempfile.tempdir = str(_active[-1]) if _active else _original_tempdir
            if not _active:
                for d in _finished:
                    remove_scratch(d)
                _finished.clear()
