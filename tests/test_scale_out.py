"""dispatch=workers on loopback: a Prefect server, two process workers standing in for two GPU hosts (each its own
folder, DVC repository, store, Prefect home and device slot) and one shared local DVC remote. A sync-chain run on
tiny-qwen3 (offline agent, smoke gate) puts its sessions on both workers as `seis-session` flow runs, engines cross
between them only through the remote, and the lineage is the one the in-process (dispatch=local) run has."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from flows.local_server import seed_database
from prefect_workers import drain_api_workers
from seis.run_config import RunConfig
from seis.session.dispatch import SessionReply
from seis.session.timeline import gate_spans, most_at_once_per_lane
from seis.store import SnapshotStore, dvc_command
from seis.workspace import tree_hash
from sync_chain_lineage import check_sync_chain_lineage

REPO_ROOT = Path(__file__).resolve().parents[1]
LIBRARY = REPO_ROOT / "seis" / "agents" / "offline" / "library"
LINEAGE = ["chain", "session", "parent_snapshot", "snapshot", "retained", "verdict", "applied", "adopted",
           "synced_from"]
WORKERS = {"host-a": "0", "host-b": "1"}       # worker name -> the device slot it owns
RUN_TIMEOUT_S = 480   # the run, from the workers' start (about 2 minutes on 2 idle cores)

pytestmark = pytest.mark.skipif(dvc_command() is None, reason="needs DVC")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefect_env(home: Path, api: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_API_URL=api, DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_CLI_PROMPT="false", PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_HEARTBEAT_SECONDS="5",
               PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY="false", **extra)
    return env


def _start(cmd: list[str], env: dict, log: Path, cwd: Path = REPO_ROOT) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _run(cmd: list[str], env: dict, cwd: Path = REPO_ROOT) -> str:
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{' '.join(cmd)}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _dvc_repo(root: Path, remote: Path) -> Path:
    """A folder standing in for a host's clone: its own DVC repository whose default remote is the shared one."""
    root.mkdir(parents=True)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    _run([*dvc_command(), "init", "-q", "--no-scm"], env, cwd=root)
    _run([*dvc_command(), "remote", "add", "-d", "shared", str(remote)], env, cwd=root)
    return root / "store"


def _hosts(tmp_path: Path):
    """One shared DVC remote, the orchestrator's and each worker's own DVC repository with its store, and a folder
    for the processes' logs."""
    remote = tmp_path / "dvc-remote"
    remote.mkdir()
    orch_store = _dvc_repo(tmp_path / "orchestrator", remote)
    stores = {name: _dvc_repo(tmp_path / name, remote) for name in WORKERS}
    logs = tmp_path / "logs"
    logs.mkdir()
    return orch_store, stores, logs


def _wait_healthy(api: str, server: subprocess.Popen, log: Path, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the Prefect server did not start in {timeout_s} s: {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> str:
    """One loopback server for the module's runs (their workers and flow runs are their own), with the seis-cpu
    pool and the `seis-session/cpu` deployment, as `prefect deploy` from the repository root makes it: its API URL.
    A test that counts session flow runs counts those its own run made (_session_runs)."""
    root = tmp_path_factory.mktemp("prefect-server")
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    log = root / "server.log"
    seed_database(root / "server-home")  # migrated already, as `seis evolve`'s own server's is
    server_env = _prefect_env(root / "server-home", api, PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED="false",
                              PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED="false")
    proc = _start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                  server_env, log)
    try:
        _wait_healthy(api, proc, log)
        _create_pool(api, "seis-cpu")
        _run([sys.executable, "-m", "prefect", "deploy", "--prefect-file", "flows/session-deployments.yaml",
              "--name", "cpu"], _prefect_env(root / "cli-home", api))
        yield api
        assert proc.poll() is None, log.read_text()[-3000:]
        drain_api_workers()  # the module's runs logged to this server: sent now, not retried at exit
    finally:
        _stop(proc)


def _session_runs(api: str) -> list:
    """The server's `seis-session` flow runs."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings
    with temporary_settings({PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["seis-session"])))


def _library(tmp_path: Path) -> Path:
    lib = tmp_path / "library"
    for name in ("batched-scoring", "decode-pinned-metadata"):
        shutil.copytree(LIBRARY / name, lib / name)
    return lib


class _Run(threading.Thread):
    """The orchestrating `seis` flow in a thread of this process, against the test server (as `seis evolve` with
    PREFECT_API_URL does)."""

    def __init__(self, config: RunConfig | None, api: str, home: Path, **params):
        super().__init__(daemon=True)
        self.config, self.api, self.home, self.params, self.state, self.error = config, api, home, params, None, None

    def run(self) -> None:
        from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

        from flows.seis_flow import seis
        try:
            with temporary_settings({PREFECT_API_URL: self.api, PREFECT_HOME: str(self.home)}):
                self.state = seis(self.config, return_state=True, **self.params)
        except BaseException as e:  # noqa: BLE001 - reported by result()
            self.error = e

    def result(self, deadline: float, logs: Path) -> Path:
        self.join(max(1.0, deadline - time.monotonic()))
        tails = {p.name: p.read_text()[-3000:] for p in logs.iterdir()}
        assert not self.is_alive(), f"the run did not finish in time: {tails}"
        assert self.error is None, self.error
        assert self.state.is_completed(), (self.state.message, tails)
        return Path(self.state.result())


def _create_pool(api: str, name: str) -> None:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    with temporary_settings({PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def _wait_workers_online(api: str, pool: str, names: set[str], since: datetime, deadline: float,
                         logs: Path) -> None:
    """Both workers polling before the run starts, so that neither takes every session of a round alone. Only a
    heartbeat after `since` counts: a worker of that name an earlier test stopped may still be listed online."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    with temporary_settings({PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                online = {w.name for w in client.read_workers_for_work_pool(pool) if w.status == "ONLINE"
                          and w.last_heartbeat_time and w.last_heartbeat_time > since}
                if names <= online:
                    return
                time.sleep(1)
    raise AssertionError(f"workers {names} not online: {[p.read_text()[-2000:] for p in logs.iterdir()]}")


@pytest.mark.slow
def test_sync_chain_on_two_workers_has_the_in_process_lineage(server, tmp_path, prepared_dir):
    t0 = time.monotonic()
    api = server
    orch_store, stores, logs = _hosts(tmp_path)
    earlier = {r.id for r in _session_runs(api)}
    procs: list[subprocess.Popen] = []
    base = dict(protocol="sync-chain", chains=2, sessions=2, sync_every=1, model="tiny-qwen3", device="cpu",
                gate="smoke", agent_library=_library(tmp_path))
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        started = datetime.now(timezone.utc)
        for name, device in WORKERS.items():  # each its own Prefect home, store and device, as on its own host
            env = _prefect_env(tmp_path / name / ".prefect", api, CUDA_VISIBLE_DEVICES=device,
                               SEIS_STORE=str(stores[name]), SEIS_WORKER_NAME=name)
            procs.append(_start([sys.executable, "-m", "prefect", "worker", "start", "--pool", "seis-cpu",
                                 "--work-queue", "sessions", "--limit", "1", "--name", name, "--type", "process"],
                                env, logs / f"{name}.log"))
        _wait_workers_online(api, "seis-cpu", set(WORKERS), started, deadline, logs)
        workers_run = _Run(RunConfig(**base, out=tmp_path / "workers-run", store=orch_store, dispatch="workers",
                                     session_deployment="seis-session/cpu"), api, tmp_path / "orchestrator-home")
        workers_run.start()
        run_dir = workers_run.result(deadline, logs)
        for proc in procs:
            assert proc.poll() is None, {p.name: p.read_text()[-2000:] for p in logs.iterdir()}

        # The lineage (parents, verdicts, applied and adopted transformations, fan-ins) is the one the same run
        # has in-process (tests/test_flow.py checks that run with the same rules).
        lineage = pd.read_parquet(run_dir / "summary.parquet")[LINEAGE]
        check_sync_chain_lineage(lineage, SnapshotStore(orch_store).id_len)

        # Every session ran on a worker, both workers ran sessions, each on its own device.
        replies = {(r.chain, r.session): r for r in (SessionReply.load(run_dir / "chains" / c / f"{s:03d}")
                                                     for c, s in zip(lineage.chain, lineage.session))}
        assert all(r is not None and not r.failure for r in replies.values()), replies
        assert {r.worker.worker for r in replies.values()} == set(WORKERS), replies
        for r in replies.values():
            assert r.worker.device == WORKERS[r.worker.worker]
            assert Path(r.worker.store) == stores[r.worker.worker]
        # The run's timeline shows both workers, never two gates at once on one device.
        spans = gate_spans(run_dir)
        assert len(spans) == len(replies) and {s.worker for s in spans} == set(WORKERS)
        assert set(most_at_once_per_lane(spans).values()) == {1}
        assert "host-a (device 0)" in (run_dir / "timeline.md").read_text()
        assert (run_dir / "figures" / "timeline.png").is_file()
        # An engine made on one worker reached the other only through the DVC remote (pulled, hash-checked).
        made_on = {r.snapshot["id"]: r.worker.worker for r in replies.values() if r.snapshot}
        crossed = [(sid, made_on[sid], r.worker.worker) for r in replies.values()
                   for sid, where in r.fetched.items() if where == "remote" and made_on.get(sid, r.worker.worker)
                   != r.worker.worker]
        assert crossed, {k: (r.worker.worker, r.fetched) for k, r in replies.items()}
        # The fan-in's peers came from the worker's own store: each peer engine restored byte for byte.
        for (chain, session), r in replies.items():
            if session == 1:
                peer = "c1" if chain == "c0" else "c0"
                want = lineage[(lineage.chain == peer) & (lineage.session == 0)].snapshot.iloc[0]
                assert want in r.fetched
                assert tree_hash(run_dir / "chains" / chain / "001" / "synced" / peer) == \
                    SnapshotStore(stores[r.worker.worker]).info(want).tree_hash
        # The orchestrator holds every engine's ref; their bytes are in the remote (its own cache never had them).
        orch = SnapshotStore(orch_store)
        for sid in made_on:
            restored = orch.get(sid, tmp_path / "check" / sid)
            assert tree_hash(restored) == orch.info(sid).tree_hash
        # Resume across workers, from an orchestrator store that never saw the workers' engines: the sessions
        # recorded by the workers are kept (their refs adopted from worker.json), none is dispatched again.
        for sid in made_on:
            for suffix in (".json", ".dvc"):
                (orch_store / f"{sid}{suffix}").unlink()
        resumed = _Run(None, api, tmp_path / "orchestrator-home", resume=str(run_dir))
        resumed.start()
        assert resumed.result(time.monotonic() + 120, logs) == run_dir
        again = pd.read_parquet(run_dir / "summary.parquet")[LINEAGE]
        pd.testing.assert_frame_equal(again.reset_index(drop=True), lineage.reset_index(drop=True))
        assert all(sid in orch for sid in made_on)
        # Each device has its own GPU slot on the server; no session ran twice.
        from prefect import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings
        with temporary_settings({PREFECT_API_URL: api}):
            with get_client(sync_client=True) as client:
                names = {limit.name for limit in client.read_global_concurrency_limits(limit=100)}
        sessions = [r for r in _session_runs(api) if r.id not in earlier]
        assert len(sessions) == len(lineage), [r.name for r in sessions]
        from tasks.gpu import device_limit
        assert {device_limit(d) for d in WORKERS.values()} <= names, names
        print(f"the run done after {time.monotonic() - t0:.0f} s; engines crossed: {crossed}")
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _descendants(pid: int) -> list[int]:
    """pid and every process below it (a worker and the flow-run processes it started in their own sessions)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


ORCHESTRATOR = """import sys
from flows.seis_flow import seis
from seis.run_config import RunConfig
state = seis(RunConfig.model_validate_json(sys.argv[1]), return_state=True)
sys.exit(0 if state.is_completed() else 1)
"""


@pytest.mark.slow
def test_a_session_lost_with_its_worker_is_redone_on_another(server, tmp_path, prepared_dir):
    """Worker A takes the only session and is killed with everything it started (a host gone); the orchestrator
    sees its heartbeat stop, marks that flow run Crashed and dispatches the session again; worker B runs it.
    The orchestrator is its own process here (as `seis evolve` is), with the lost-worker time shortened to 15 s
    (three heartbeats); the re-dispatched run, a cold flow-run process on 2 busy cores, has the start allowance
    until its first beat."""
    from seis.session.dispatch import HEARTBEAT_FILE, LOST_AFTER_ENV
    api = server
    orch_store, stores, logs = _hosts(tmp_path)
    earlier = {r.id for r in _session_runs(api)}
    procs: dict[str, subprocess.Popen] = {}

    def start_worker(name: str) -> None:
        started = datetime.now(timezone.utc)
        env = _prefect_env(tmp_path / name / ".prefect", api, CUDA_VISIBLE_DEVICES=WORKERS[name],
                           SEIS_STORE=str(stores[name]), SEIS_WORKER_NAME=name)
        procs[name] = _start([sys.executable, "-m", "prefect", "worker", "start", "--pool", "seis-cpu",
                              "--work-queue", "sessions", "--limit", "1", "--name", name, "--type", "process"],
                             env, logs / f"{name}.log")
        _wait_workers_online(api, "seis-cpu", {name}, started, time.monotonic() + 120, logs)

    try:
        start_worker("host-a")
        config = RunConfig(protocol="chain", chains=1, sessions=1, model="tiny-qwen3", device="cpu", gate="smoke",
                           agent_library=_library(tmp_path), out=tmp_path / "run", store=orch_store,
                           dispatch="workers", session_deployment="seis-session/cpu")
        procs["orchestrator"] = run = _start([sys.executable, "-c", ORCHESTRATOR, config.model_dump_json()],
                                             _prefect_env(tmp_path / "orchestrator-home", api,
                                                          **{LOST_AFTER_ENV: "15"}), logs / "orchestrator.log")
        beat = tmp_path / "run" / "chains" / "c0" / "000" / HEARTBEAT_FILE
        deadline = time.monotonic() + 240
        while not beat.exists():
            assert time.monotonic() < deadline and run.poll() is None, {p.name: p.read_text()[-2000:]
                                                                        for p in logs.iterdir()}
            time.sleep(0.5)
        for pid in _descendants(procs["host-a"].pid):  # host A gone: its worker and the session's flow run
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        procs["host-a"].wait()
        start_worker("host-b")
        assert run.wait(timeout=300) == 0, {p.name: p.read_text()[-3000:] for p in logs.iterdir()}
        run_dir = tmp_path / "run"
        assert "worker lost: no heartbeat" in (logs / "orchestrator.log").read_text()

        reply = SessionReply.load(run_dir / "chains" / "c0" / "000")
        assert reply is not None and not reply.failure and reply.worker.worker == "host-b", reply
        summary = pd.read_parquet(run_dir / "summary.parquet")
        assert len(summary) == 1 and summary.snapshot.iloc[0], summary
        runs = [r for r in _session_runs(api) if r.id not in earlier]
        states = sorted((r.state.type.value, r.state.message or "") for r in runs)
        assert [s for s, _ in states] == ["COMPLETED", "CRASHED"], states
        assert "worker lost: no heartbeat" in states[1][1], states
        assert not beat.exists()  # the finished session stopped beating and removed its heartbeat
    finally:
        for proc in reversed(list(procs.values())):
            _stop(proc)


def test_heartbeat_and_the_lost_rules(tmp_path, monkeypatch):
    from seis.session.dispatch import (HEARTBEAT_FILE, LOST_AFTER_ENV, START_AFTER_ENV, Heartbeat, LostTracker,
                                       lost_after_s, start_after_s)
    with Heartbeat(tmp_path / "s", "run-1", every_s=0.05):
        time.sleep(0.2)
        assert (tmp_path / "s" / HEARTBEAT_FILE).read_text() == "run-1"
        tracker = LostTracker(tmp_path / "s", "run-1", lost_after=30)
        assert tracker.lost("RUNNING") is None
        assert tracker.lost("RUNNING", now=time.time() + 31).startswith("no heartbeat for 31")  # beats stopped
    assert not (tmp_path / "s" / HEARTBEAT_FILE).exists()
    # Never beat (or another attempt's beat): the start allowance, counted from when it was first seen running.
    (tmp_path / "s" / HEARTBEAT_FILE).write_text("run-0")
    tracker = LostTracker(tmp_path / "s", "run-1", lost_after=30, start_after=60)
    assert tracker.lost("SCHEDULED", now=0.0) is None            # waiting for a worker is never lost
    assert tracker.lost("SCHEDULED", now=10_000.0) is None
    assert tracker.lost("PENDING", now=10_000.0) is None         # taken by a worker ...
    assert tracker.lost("PENDING", now=10_059.0) is None
    assert tracker.lost("PENDING", now=10_061.0) == "taken by a worker but not started for 61 s"  # ... never started
    assert tracker.lost("RUNNING", now=10_100.0) is None          # started after all, not beating yet
    assert tracker.lost("RUNNING", now=10_159.0) is None
    assert tracker.lost("RUNNING", now=10_161.0) == "running but no heartbeat yet after 61 s"
    assert tracker.lost("PENDING", now=10_200.0) is None          # back to PENDING (a retry): counted afresh
    assert tracker.lost("RUNNING", now=10_300.0) is None
    (tmp_path / "s" / HEARTBEAT_FILE).write_text("run-1")         # its first beat: the heartbeat rule now
    beat = (tmp_path / "s" / HEARTBEAT_FILE).stat().st_mtime
    assert tracker.lost("RUNNING", now=beat + 29) is None
    assert tracker.lost("RUNNING", now=beat + 31) == "no heartbeat for 31 s"
    for env, read in ((LOST_AFTER_ENV, lost_after_s), (START_AFTER_ENV, start_after_s)):
        monkeypatch.setenv(env, "5")
        with pytest.raises(ValueError, match="more than two heartbeats"):
            read()
        monkeypatch.setenv(env, "soon")
        with pytest.raises(ValueError, match="not a number"):
            read()
        monkeypatch.delenv(env)
    assert (lost_after_s(), start_after_s()) == (120.0, 600.0)


def test_a_snapshot_ref_must_name_its_own_tree(tmp_path):
    """A worker records a ref only if its id is its tree hash and it does not contradict what is stored."""
    from seis.engine_import import ENGINE_TEMPLATE
    from seis.store import SnapshotRef, StoreError
    from seis.workspace.tree import copy_tree

    engine = tmp_path / "engine"
    copy_tree(ENGINE_TEMPLATE, engine)
    a, b = SnapshotStore(tmp_path / "a", use_dvc=False), SnapshotStore(tmp_path / "b", use_dvc=False)
    ref = a.export_ref(a.put(engine))
    forged = SnapshotRef(ref.id, {**ref.manifest, "tree_hash": "0" * 64}, ref.dvc_file)
    with pytest.raises(StoreError, match="inconsistent"):
        b.import_ref(forged)
    assert ref.id not in b
    assert b.import_ref(ref) and not b.import_ref(ref)     # recorded once
    lookalike = {**ref.manifest, "tree_hash": ref.id + "f" * (64 - len(ref.id))}   # same id, another tree
    with pytest.raises(StoreError, match="another tree"):
        b.import_ref(SnapshotRef(ref.id, lookalike, None))
    with pytest.raises(StoreError, match="missing"):       # a plain store cannot fetch what it never had
        b.fetch(ref.id)


def test_a_snapshot_ref_cannot_steer_reads_writes_modes_or_dvc_outside_its_snapshot(tmp_path):
    """A ref travels from a worker (or another store) as data: its manifest's paths are where `get` reads and
    writes, its modes are what it sets, and its .dvc file is written into the store's DVC repository. None of
    them may reach outside the snapshot, set a setuid bit, or give DVC another output."""
    from seis.engine_import import ENGINE_TEMPLATE
    from seis.store import SnapshotRef, StoreError
    from seis.workspace.tree import copy_tree

    engine = tmp_path / "engine"
    copy_tree(ENGINE_TEMPLATE, engine)
    a, b = SnapshotStore(tmp_path / "a", use_dvc=False), SnapshotStore(tmp_path / "b", use_dvc=False)
    ref = a.export_ref(a.put(engine))
    files = ref.manifest["files"]
    for path in ("../../outside.py", "/etc/passwd", "engine/../../x", ".git/config", "engine//x.py",
                 "engine/.dvc/config"):
        forged = {**ref.manifest, "files": files + [{**files[0], "path": path}]}
        with pytest.raises(StoreError, match="refused"):
            b.import_ref(SnapshotRef(ref.id, forged, None))
    for dvc_file in (f"outs:\n- path: ../{ref.id}\n", f"outs:\n- path: {ref.id}\ncmd: touch x\n",
                     f"outs:\n- path: {ref.id}\n- path: other\n", "[unclosed"):
        with pytest.raises(StoreError, match="refused"):
            b.import_ref(SnapshotRef(ref.id, ref.manifest, dvc_file))
    assert ref.id not in b
    # a manifest with a setuid mode restores the file without it
    setuid = {**ref.manifest, "files": [{**f, "mode": "0o4777"} for f in files]}
    (a.root / f"{ref.id}.json").write_text(json.dumps({**setuid, "id": ref.id}))
    out = a.get(ref.id, tmp_path / "restored")
    assert all((out / f["path"]).stat().st_mode & 0o7777 == 0o755 for f in files)


def test_workers_dispatch_without_a_server_is_refused_before_any_work(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.seis_flow import _check_workers_reachable
    config = RunConfig(dispatch="workers", out=tmp_path / "run", store=tmp_path / "store", gate="smoke",
                       device="cpu")
    with temporary_settings({PREFECT_API_URL: None}):
        with pytest.raises(ValueError, match="PREFECT_API_URL"):
            _check_workers_reachable(config)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="session_deployment"):
        RunConfig(dispatch="workers", session_deployment="no-slash")


def test_session_deployments_load_and_fit_their_pools():
    """flows/session-deployments.yaml: the installed Prefect's schema, the `seis-session` flow, one GPU and one CPU
    deployment on the `sessions` queue of their pools (a worker on it never takes a whole run)."""
    import yaml
    from prefect.flows import load_flow_from_entrypoint

    from tasks.prefect_private import prefect_yaml_model

    prefect_yaml = yaml.safe_load((REPO_ROOT / "flows" / "session-deployments.yaml").read_text())
    prefect_yaml_model().model_validate(prefect_yaml)
    deployments = {d["name"]: d for d in prefect_yaml["deployments"]}
    assert {n: (d["work_pool"]["name"], d["work_pool"]["work_queue_name"]) for n, d in deployments.items()} == \
        {"cuda": ("seis-cuda", "sessions"), "cpu": ("seis-cpu", "sessions")}
    assert RunConfig().session_deployment == "seis-session/cuda"
    for d in deployments.values():
        path, _, func = d["entrypoint"].partition(":")
        flow = load_flow_from_entrypoint(f"{REPO_ROOT / path}:{func}")
        assert flow.name == "seis-session" and set(flow.parameters.model_dump()["properties"]) == {"request"}


def _process_groups() -> set[int]:
    """The process groups of every live process (a zombie runs nothing: its parent has yet to reap it)."""
    groups = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            groups.add(int(fields[2]))
    return groups


@pytest.mark.slow
def test_one_host_workers_script_serves_a_run_and_stops_everything(tmp_path, prepared_dir):
    """scripts/one-host-workers.sh (README): `up --cpu 1` brings a server, the pool, the deployment and a worker;
    a run dispatched to it records that worker; `down` leaves no process of any of them."""
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    script = str(REPO_ROOT / "scripts" / "one-host-workers.sh")
    try:
        up = subprocess.run(["bash", script, "up", "--cpu", "1", "--state", str(state)], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        api = (state / "api").read_text().strip()
        assert f"export PREFECT_API_URL={api}" in up.stdout
        groups = {int(p.read_text()) for p in state.glob("*.pid")}
        assert len(groups) == 2                                          # the server and one worker
        run = tmp_path / "run"
        done = subprocess.run([sys.executable, "-m", "seis.cli", "evolve", "--dispatch", "workers",
                               "--session-deployment", "seis-session/cpu", "--protocol", "chain", "--chains", "1",
                               "--sessions", "1", "--model", "tiny-qwen3", "--device", "cpu", "--gate", "smoke",
                               "--out", str(run), "--store", str(tmp_path / "store")],
                              env={**env, "PREFECT_API_URL": api}, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        reply = SessionReply.load(run / "chains" / "c0" / "000")
        assert reply is not None and not reply.failure and reply.worker.worker.endswith("-cpu0")
        assert reply.worker.device == "0"
    finally:
        down = subprocess.run(["bash", script, "down", "--state", str(state)], env=env, capture_output=True,
                              text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    deadline = time.monotonic() + 10   # killed processes leave /proc once their parent (init) reaps them
    while groups & _process_groups() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(state.glob("*.pid")) and not groups & _process_groups()
