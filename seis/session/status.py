"""`status.json` of a run directory: whether the run is running, finished or was interrupted, so that a reader
(and `--resume`) can tell a half-finished run folder from a complete one.

A process killed outright cannot write anything: its run stays `running` with a pid that no longer exists,
which `RunStatus.alive` reveals. `sessions_done` counts the sessions whose outcome is recorded, updated as each
one is (`count_sessions_done`), so a reader sees a run's progress while it runs and after a crash.

Every write is a read-modify-write of the whole file under one lock (`.status.lock` beside it), so the flow and
sessions finishing in parallel threads (or on workers sharing the run directory) never lose each other's update.

A run's end stands: once `complete`, `failed`, `cancelled` or `crashed` is written, a later writer (a cancellation
seen just after the run completed, a cleanup hook, a worker) changes nothing, so the file never says a finished
run was cancelled or reopens an ended one. Only a resume starts it again (`restart=True`); and an interrupted run
(`crashed`) may still be told `cancelled` by the hook that learns the interruption was a cancellation.

A run is one attempt's (flow run) at a time: every write names its attempt, the write that starts the run records
it as `flow_run_id`, and a write by another attempt (an earlier attempt's cleanup hook, run by its worker after a
resume already started) changes nothing.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel

from ..files import set_aside, write_atomic

STATUS_FILE = "status.json"
STATUS_LOCK = ".status.lock"
State = Literal["running", "complete", "failed", "cancelled", "crashed"]
FINISHED_FAILED_NOTE = ("every session of this run is recorded, but none reached a verdict (see message); resuming "
                        "would end the same way: fix the cause and start a new run")
REFUSED = "refused before any work"   # how a run refused at its start ends: nothing of it to resume
UNFINISHED_NOTE = ("this run is not finished; continue it with `seis evolve --resume {root}` (in Prefect: the flow "
                   "parameter resume={root})")


class RunStatus(BaseModel):
    state: State
    updated_at: str
    pid: int
    host: str
    sessions_done: int = 0
    sessions_total: int = 0
    resumes: int = 0
    flow_run_id: str = ""   # the attempt (flow run) that last started the run; "" where unknown
    message: str = ""
    note: str = ""

    @property
    def alive(self) -> bool:
        """Whether the process that last wrote `running` still exists (on this host)."""
        if self.host != socket.gethostname():
            return True  # cannot tell from here
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def read_status(root: Path) -> RunStatus | None:
    try:
        return RunStatus.model_validate_json((Path(root) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None


def _locked(root: Path):
    from ..store.lock import FileLock
    return FileLock(Path(root) / STATUS_LOCK, timeout_s=60.0)


def _save(root: Path, status: RunStatus) -> RunStatus:
    write_atomic(Path(root) / STATUS_FILE, json.dumps(status.model_dump(), indent=2) + "\n")
    return status


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _may_replace(old: State, new: State, restart: bool) -> bool:
    """Whether `new` may overwrite `old`. Writers race at a run's end (the flow's own `complete` and a cancellation
    seen a moment later; a hook or a worker acting late), so the first end written is the truth and is kept."""
    if old == "running":
        return True
    if new == "running":
        return restart          # a resume (or a new attempt) starts the ended run again
    return (old, new) == ("crashed", "cancelled")   # the hook says why the run was interrupted


def write_status(root: Path, state: State, *, flow_run_id: str, restart: bool = False, **values) -> RunStatus:
    """Update status.json (atomically, under the status lock) as attempt `flow_run_id`, keeping the fields not given.
    `note` defaults to how to continue the run, for every state but `complete`. A run that has ended keeps its
    status untouched (returned as it is), unless `_may_replace` allows the new state; `restart`: this write
    (re)starts the run. A write by another attempt than the one that last started the run changes nothing."""
    with _locked(root):
        old = read_status(root)
        if old is None and (Path(root) / STATUS_FILE).is_file():  # unreadable: a new one starts, the old one kept
            kept = set_aside(Path(root) / STATUS_FILE)
            values["message"] = (f"{values.get('message') or ''} the earlier {STATUS_FILE} could not be read: kept as "
                                 f"{kept.name}; sessions_done and resumes count from here").strip()
        # an earlier attempt's hook (or flow) can come after a resume restarted the run: its end is not the live one's
        stale = not restart and old is not None and old.flow_run_id not in ("", str(flow_run_id))
        if old is not None and (stale or not _may_replace(old.state, state, restart)):
            return old
        if restart or old is None:
            values["flow_run_id"] = str(flow_run_id)
        base = old.model_dump() if old is not None else {}
        note = values.pop("note", None)
        base.update(values, state=state, updated_at=_now(), pid=os.getpid(), host=socket.gethostname())
        base["note"] = note if note is not None else ("" if state == "complete"
                                                      else UNFINISHED_NOTE.format(root=Path(root)))
        return _save(root, RunStatus(**base))


def count_sessions_done(root: Path, count: Callable[[], int]) -> RunStatus | None:
    """Set sessions_done to `count()` (the outcomes on disk), counted and written under the status lock, so two
    sessions recorded at once both show; state, pid and host are left as the flow wrote them. None (nothing
    written) where the directory has no status.json: not a run directory."""
    if not (Path(root) / STATUS_FILE).is_file():
        return None
    with _locked(root):
        old = read_status(root)
        if old is None:
            return None
        return _save(root, old.model_copy(update={"sessions_done": count(), "updated_at": _now()}))
