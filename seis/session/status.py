"""`status.json` of a run directory: whether the run is running, finished or was interrupted, so that a reader
(and `--resume`) can tell a half-finished run folder from a complete one.

A process killed outright cannot write anything: its run stays `running` with a pid that no longer exists,
which `RunStatus.alive` reveals.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

STATUS_FILE = "status.json"
State = Literal["running", "complete", "failed", "cancelled", "crashed"]
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


def write_status(root: Path, state: State, **values) -> RunStatus:
    """Update status.json (atomically), keeping the fields not given."""
    old = read_status(root)
    base = old.model_dump() if old is not None else {}
    base.update(values, state=state, updated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), pid=os.getpid(),
                host=socket.gethostname())
    base["note"] = "" if state == "complete" else UNFINISHED_NOTE.format(root=Path(root))
    status = RunStatus(**base)
    path = Path(root) / STATUS_FILE
    part = path.with_suffix(".json.part")
    part.write_text(json.dumps(status.model_dump(), indent=2) + "\n")
    os.replace(part, path)
    return status
