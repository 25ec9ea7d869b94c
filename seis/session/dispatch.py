"""Sessions on workers (dispatch=workers), as data: what the orchestrating `seis` flow sends one `seis-session`
flow run, and what that run leaves for it.

The orchestrator keeps the protocol state (lineage, fan-ins, summary); a session's request carries everything
else by value: the run config, the session's place (chain, index, parent), the inherited and peers' reports,
and the snapshots it needs as refs (manifest + .dvc file). Engine bytes never travel in a request: the worker
restores them from the shared DVC remote into its own store, hash-checked (seis.store). The worker writes its
session files into the run directory (which both reach) and `worker.json`: who ran it, on which device, what it
pulled from the remote, and the ref of the engine it retained.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..config import RunConfig
from ..store import SnapshotRef
from ..workspace import PeerMaterial, Report
from .lineage import ChainState
from .protocol import session_spec
from .resume import load_outcome
from .rundir import RunDir
from .spec import SessionResult, SessionSpec

REPLY_FILE = "worker.json"
STORE_ENV = "SEIS_STORE"            # a worker's own snapshot store (default: the run config's `store`)
WORKER_ENV = "SEIS_WORKER_NAME"     # a worker's name in the records (default: the host name)
DEVICE_ENV = "CUDA_VISIBLE_DEVICES"  # the device a worker owns (its job variables or its environment)


class PeerRef(BaseModel):
    """A peer chain's latest retained engine (by snapshot id) and its reports, handed over at a fan-in."""
    model_config = ConfigDict(frozen=True)
    chain: str
    snapshot: str
    reports: list[dict] = Field(default_factory=list)


class SessionRequest(BaseModel):
    model_config = ConfigDict(frozen=True)
    config: dict                                   # the RunConfig, JSON
    run_dir: str                                   # where the session's files go (the orchestrator reads them)
    chain: str
    chain_index: int
    session: int
    parent_snapshot: str
    vanilla_snapshot: str
    inherited: list[dict] = Field(default_factory=list)        # Report.to_dict(), oldest first
    peers: list[PeerRef] = Field(default_factory=list)
    snapshots: list[dict] = Field(default_factory=list)        # SnapshotRef.to_dict() of parent, vanilla, peers

    def run_config(self, store: Path) -> RunConfig:
        """The run's config with this worker's own store."""
        return RunConfig.model_validate({**self.config, "store": str(store)})

    @property
    def session_dir(self) -> Path:
        return RunDir(Path(self.run_dir)).session_dir(self.chain, self.session)

    def spec(self, peer_dirs: dict[str, Path], device_slot: str = "") -> SessionSpec:
        config = RunConfig.model_validate(self.config)
        peers = tuple(PeerMaterial(p.chain, peer_dirs[p.chain], tuple(Report.from_dict(r) for r in p.reports))
                      for p in self.peers)
        return SessionSpec(run_id=config.run_id, chain=self.chain, chain_index=self.chain_index,
                           session=self.session, parent_snapshot=self.parent_snapshot, session_dir=self.session_dir,
                           vanilla_snapshot=self.vanilla_snapshot,
                           inherited=tuple(Report.from_dict(r) for r in self.inherited), peers=peers,
                           synced_from=tuple(p.chain for p in self.peers), device_slot=device_slot)

    def refs(self) -> list[SnapshotRef]:
        return [SnapshotRef.from_dict(r) for r in self.snapshots]


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
        path, part = session_dir / REPLY_FILE, session_dir / (REPLY_FILE + ".part")
        part.write_text(self.model_dump_json(indent=2) + "\n")
        os.replace(part, path)
        return path

    @classmethod
    def load(cls, session_dir: Path) -> "SessionReply | None":
        try:
            return cls.model_validate(json.loads((session_dir / REPLY_FILE).read_text()))
        except (OSError, ValueError):
            return None


def worker_store(config_store: Path) -> Path:
    """This worker's snapshot store: $SEIS_STORE, else the run config's."""
    return Path(os.environ.get(STORE_ENV) or config_store).expanduser().resolve()


def peer_refs(states: dict[str, ChainState]) -> dict[str, list[PeerRef]]:
    """A fan-in by reference: for every chain, every other chain's latest retained engine and reports."""
    refs = {c: PeerRef(chain=c, snapshot=s.snapshot, reports=[r.to_dict() for r in s.reports])
            for c, s in states.items()}
    return {c: [p for other, p in sorted(refs.items()) if other != c] for c in states}


def session_request(config: RunConfig, run: RunDir, store, vanilla: str, states: dict[str, ChainState],
                    peers: dict[str, list[PeerRef]], session: int, chain: str) -> SessionRequest:
    """The request for one session, from the same protocol rules as the local mode (session_spec)."""
    spec = session_spec(config, run, vanilla, states, {}, session, chain)
    mine = peers.get(chain, [])
    needed = dict.fromkeys([spec.parent_snapshot, vanilla, *(p.snapshot for p in mine)])
    return SessionRequest(config=json.loads(config.model_dump_json()), run_dir=str(run.root), chain=chain,
                          chain_index=spec.chain_index, session=session, parent_snapshot=spec.parent_snapshot,
                          vanilla_snapshot=vanilla, inherited=[r.to_dict() for r in spec.inherited], peers=mine,
                          snapshots=[store.export_ref(s).to_dict() for s in needed])


def materialize(store, request: SessionRequest) -> dict[str, str]:
    """Record the request's snapshots in this worker's store and make their files present (pulled from the DVC
    remote when this machine lacks them, hash-checked); returns id -> where each came from."""
    for ref in request.refs():
        store.import_ref(ref)
    return {ref.id: store.fetch(ref.id) for ref in request.refs()}


def collect(store, run: RunDir, chain: str, session: int, flow_state: str = "") -> SessionResult:
    """What a session run on a worker left in the run directory, as the local mode's SessionResult; its engine's
    ref goes into the orchestrator's store (the files stay in the remote until someone needs them)."""
    from .display import run_label

    session_dir = run.session_dir(chain, session)
    reply = SessionReply.load(session_dir)
    if reply is None:
        return SessionResult(chain, session, failure=f"{run_label(chain, session)}: the session's flow run left no "
                                                     f"{REPLY_FILE} ({flow_state or 'no final state'})")
    if reply.failure:
        return SessionResult(chain, session, failure=reply.failure)
    if reply.snapshot is not None:
        store.import_ref(SnapshotRef.from_dict(reply.snapshot))
    outcome = load_outcome(session_dir)
    if outcome is None:
        return SessionResult(chain, session, failure=f"{run_label(chain, session)}: no outcome recorded by "
                                                     f"{reply.worker.worker}")
    return SessionResult(chain, session, outcome=outcome)


def adopt_recorded(store, session_dir: Path) -> None:
    """Resume: a session finished on a worker is finished here once its engine's ref is in this store."""
    reply = SessionReply.load(session_dir)
    if reply is not None and reply.snapshot is not None:
        store.import_ref(SnapshotRef.from_dict(reply.snapshot))
