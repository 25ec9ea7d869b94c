"""The `seis-session` flow: one session (agent edit -> build + gate -> snapshot -> report) on the worker that picked
it up, for a `seis` run with dispatch=workers (deployments: flows/session-deployments.yaml).

It runs the local mode's session task (tasks/session.py) unchanged; what differs is only where its inputs come
from: the request (seis.session.dispatch) names the parent, vanilla and peers' engines by snapshot, and this
worker's own store restores them from the shared DVC remote. The worker's device (CUDA_VISIBLE_DEVICES from its
environment or job variables) is what its gate, engines and the agent's dev benchmark see (the sandbox passes it
through), and the gate holds that device's own slot. The session's files, and `worker.json` with who ran it and
the ref of the engine it retained, go to the run directory, where the orchestrator reads them. The memory
preflight runs here, on the machine whose memory the gate will use: a session that cannot fit fails with the
numbers before any work. A session whose flow run is cancelled (by hand, or with its parent run) stops within
seconds and ends Cancelled (tasks/cancel.py).
"""
from __future__ import annotations

from pathlib import Path

from prefect import flow, tags

from flows.runtime import quiet_thread_timeout_notice
from seis.sandbox import interrupt_on_exit_signal
from seis.session.dispatch import Heartbeat, SessionReply, SessionRequest, WorkerInfo, materialize, worker_store
from seis.session.display import run_label, run_tags
from seis.session.preflight import check_gate_memory
from seis.session.resume import clear
from seis.store import SnapshotStore
from tasks.cancel import CancelWatch
from tasks.cleanup import release_run
from tasks.gpu import device_limit, ensure_gpu_limit
from tasks.session import session_task

quiet_thread_timeout_notice()


@flow(name="seis-session", log_prints=True, flow_run_name="{request.chain}/s{request.session}",
      on_cancellation=[release_run], on_crashed=[release_run])
def seis_session(request: SessionRequest) -> dict:
    """Run one session of a `seis` run; returns (and writes as worker.json) the SessionReply."""
    from prefect.runtime import flow_run

    label = run_label(request.chain, request.session)
    store_root = worker_store(Path(request.config["store"]))
    worker = WorkerInfo.here(store_root, flow_run.id)
    session_dir = request.session_dir
    print(f"[{label}] on {worker.worker} (host {worker.host}, device {worker.device or 'not pinned'}, "
          f"store {store_root})")
    reply = SessionReply(chain=request.chain, session=request.session, worker=worker)
    # Heartbeat: the orchestrator's sign that this worker is still there. A termination signal kills the gate's
    # engines now; so does a cancellation, seen by the watcher within seconds even before the worker acts on it.
    with Heartbeat(session_dir, flow_run.id), interrupt_on_exit_signal(), CancelWatch(flow_run.id) as cancel:
        answer = _run_session(request, label, store_root, worker, session_dir, reply)
    return cancel.cancelled_state(f"session {label}") if cancel.requested else answer


def _run_session(request: SessionRequest, label: str, store_root: Path, worker: WorkerInfo, session_dir: Path,
                 reply: SessionReply) -> dict:
    try:
        config = request.run_config(store=store_root)
        print(f"[{label}] memory: {check_gate_memory(config).describe()}")  # this machine's, before any work
        store = SnapshotStore(store_root)
        fetched = materialize(store, request)
        reply = reply.model_copy(update={"fetched": fetched})
        pulled = [sid for sid, where in fetched.items() if where == "remote"]
        if pulled:
            print(f"[{label}] pulled from the DVC remote: {', '.join(pulled)}")
        synced = session_dir / "synced"
        clear(synced)
        peer_dirs = {p.chain: store.get(p.snapshot, synced / p.chain) for p in request.peers}
        spec = request.spec(peer_dirs, device_slot=worker.device)
        ensure_gpu_limit(name=device_limit(spec.device_slot))
        with tags(*run_tags(request.chain, request.session)):
            result = session_task(config, spec, store_root)
        if result.outcome is None:
            reply = reply.model_copy(update={"failure": result.failure})
        else:
            reply = reply.model_copy(update={"snapshot": store.export_ref(result.outcome.snapshot).to_dict()})
    except Exception as e:  # reported to the orchestrator as this session's failure; the traceback is logged here
        reply = reply.model_copy(update={"failure": f"{label} on {worker.worker}: {type(e).__name__}: {e}"})
        reply.save(session_dir)
        raise
    reply.save(session_dir)
    return reply.model_dump(mode="json")
