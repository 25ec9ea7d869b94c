"""What a session leaves about who ran it: `worker.json` in its session directory (the worker, its host and
device, what it fetched, the ref of the engine it retained). Plain records: the dispatch to workers writes and
reads them (seis.session.dispatch), and the run's timeline reads where each gate ran from them."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..files import write_atomic

REPLY_FILE = "worker.json"
WORKER_ENV = "SEIS_WORKER_NAME"     # a worker's name in the records (default: the host name)
DEVICE_ENV = "CUDA_VISIBLE_DEVICES"  # the device a worker owns (its job variables or its environment)


class WorkerInfo(BaseModel):
    """Who ran a session: recorded in its `worker.json` (and the local mode's too)."""
    model_config = ConfigDict(frozen=True)
    worker: str
    host: str
    pid: int
    device: str = ""                 # CUDA_VISIBLE_DEVICES of the worker ('' = not pinned to a device)
    store: str = ""
    flow_run_id: str = ""

    @classmethod
    def here(cls, store: Path | str = "", flow_run_id: str = "") -> "WorkerInfo":
        host = socket.gethostname()
        return cls(worker=os.environ.get(WORKER_ENV) or host, host=host, pid=os.getpid(),
                   device=os.environ.get(DEVICE_ENV, ""), store=str(store), flow_run_id=str(flow_run_id))


class SessionReply(BaseModel):
    chain: str
    session: int
    worker: WorkerInfo
    failure: str = ""
    fetched: dict[str, str] = Field(default_factory=dict)      # snapshot id -> present | cache | remote
    snapshot: dict | None = None                               # SnapshotRef of the session's engine

    def save(self, session_dir: Path) -> Path:
        session_dir.mkdir(parents=True, exist_ok=True)
        return write_atomic(session_dir / REPLY_FILE, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, session_dir: Path) -> "SessionReply | None":
        try:
            return cls.model_validate(json.loads((session_dir / REPLY_FILE).read_text()))
        except (OSError, ValueError):
            return None
