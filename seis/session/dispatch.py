"""Sessions on workers (dispatch=workers), as data: what the orchestrating `seis` flow sends one `seis-session`
flow run, and what that run leaves for it.

The orchestrator keeps the protocol state (lineage, fan-ins, summary); a session's request carries everything
else by value: the run config, the session's place (chain, index, parent), the inherited and peers' reports,
and the snapshots it needs as refs (manifest + .dvc file). Engine bytes never travel in a request: the worker
restores them from the shared DVC remote into its own store, hash-checked (seis.store). The worker writes its
session files into the run directory (which both reach) and `worker.json`: who ran it, on which device, what it
pulled from the remote, and the ref of the engine it retained. While it runs, the session refreshes a heartbeat
file there; a session whose heartbeat stops (its worker or host gone) is declared lost by the orchestrator, which
marks its flow run Crashed and dispatches the session again (another worker may take it).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..files import write_atomic
from ..run_config import RunConfig
from ..store import SnapshotRef
from ..workspace import PeerMaterial, Report
from .lineage import ChainState
from .protocol import session_spec
from .resume import load_outcome
from .rundir import RunDir
from .spec import SessionResult, SessionSpec
from .worker_reply import DEVICE_ENV, REPLY_FILE, WORKER_ENV, SessionReply, WorkerInfo  # noqa: F401 (re-exported)

STORE_ENV = "SEIS_STORE"            # a worker's own snapshot store (default: the run config's `store`)
HEARTBEAT_FILE = "worker.alive"     # refreshed by a running session: its flow run id
HEARTBEAT_S = 5.0
LOST_AFTER_ENV = "SEIS_WORKER_LOST_S"  # no heartbeat for this long: the session's worker is lost (default 120)
START_AFTER_ENV = "SEIS_WORKER_START_S"  # taken by a worker (PENDING) but not started for this long: lost (600)
REDISPATCHES = 2                    # a lost session is dispatched again at most this many times


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


class Heartbeat:
    """While open, rewrites session_dir/worker.alive (this flow run's id) every HEARTBEAT_S seconds."""

    def __init__(self, session_dir: Path, flow_run_id: str, every_s: float = HEARTBEAT_S):
        self.path, self.flow_run_id, self.every_s = session_dir / HEARTBEAT_FILE, str(flow_run_id), every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="seis-heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            try:
                write_atomic(self.path, self.flow_run_id)
            except OSError:  # the session dir is being replaced (resume): the next beat writes again
                pass
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "Heartbeat":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)


def _seconds(name: str, default: str, at_least: float) -> float:
    raw = os.environ.get(name, default)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= at_least:
        raise ValueError(f"{name}={raw!r}: must be more than two heartbeats ({at_least:g} s)")
    return value


def lost_after_s() -> float:
    return _seconds(LOST_AFTER_ENV, "120", 2 * HEARTBEAT_S)


def start_after_s() -> float:
    return _seconds(START_AFTER_ENV, "600", 2 * HEARTBEAT_S)


def heartbeat_age(session_dir: Path, flow_run_id: str, now: float | None = None) -> float | None:
    """Seconds since the flow run `flow_run_id` last beat in session_dir; None when it has not (yet)."""
    path = session_dir / HEARTBEAT_FILE
    try:
        if path.read_text().strip() != str(flow_run_id):
            return None
        return (time.time() if now is None else now) - path.stat().st_mtime
    except OSError:
        return None


class LostTracker:
    """Decides, from polls of a dispatched session's flow-run state, when its worker is lost: RUNNING and its
    heartbeat silent for lost_after s; RUNNING without a first beat, or PENDING -- taken by a worker, which then
    never started it -- for start_after s (a cold flow-run process takes a while to reach its first beat on a busy
    host). SCHEDULED (no worker has taken it yet) is waiting, never lost."""

    def __init__(self, session_dir: Path, flow_run_id: str, lost_after: float, start_after: float = 600.0):
        self.session_dir, self.flow_run_id = session_dir, str(flow_run_id)
        self.lost_after, self.start_after = lost_after, start_after
        self.running_since: float | None = None
        self.pending_since: float | None = None

    def lost(self, state: str | None, now: float | None = None) -> str | None:
        """Why the worker is lost (state: the flow run's state type, e.g. "RUNNING"), else None."""
        now = time.time() if now is None else now
        if state != "PENDING":
            self.pending_since = None
        if state != "RUNNING":
            self.running_since = None
        if state == "PENDING":
            self.pending_since = self.pending_since or now
            waited = now - self.pending_since
            return f"taken by a worker but not started for {waited:.0f} s" if waited > self.start_after else None
        if state != "RUNNING":
            return None
        self.running_since = self.running_since or now
        age = heartbeat_age(self.session_dir, self.flow_run_id, now)
        if age is None:
            waited = now - self.running_since
            return f"running but no heartbeat yet after {waited:.0f} s" if waited > self.start_after else None
        return f"no heartbeat for {age:.0f} s" if age > self.lost_after else None
