"""Cancelling a run stops it within seconds: the slot acquisition refuses a cancelled run (before and while it waits),
the cancellation watcher kills the run's process groups, releases its GPU slots and cancels its child session flow
runs, and a flow whose run is cancelled ends Cancelled with nothing left running and no queued gate served.
A slot's wait names the holder's run too. A cancellation (or any writer) that comes after the run ended leaves
status.json as the run ended it; only a resume starts it again. Everything else against the module's Prefect test
server: about 20 s on 2 cores besides the server's start (the end-to-end flow, in a subprocess, 6 to 12 s of it)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from uuid import UUID

import pytest

import flows  # noqa: F401  (SEIS's Prefect settings, before the test server starts)
from polling import until


LIMIT = "seis-gpu-test-cancel"


@pytest.fixture
def home(harness, tmp_path, monkeypatch):
    """A Prefect home of the test's own (the lease registry lives there), and a process not yet interrupted."""
    import seis.sandbox.process as process
    from prefect.settings import PREFECT_HOME, temporary_settings
    monkeypatch.setattr(process, "_INTERRUPTED", threading.Event())  # the watcher interrupts this process
    with temporary_settings({PREFECT_HOME: str(tmp_path / "prefect-home")}):
        yield tmp_path


def _client():
    from prefect import get_client
    return get_client(sync_client=True)


def _flow_run(name: str = "nightly", parent_task_run=None, state=None, parameters=None):
    from prefect import flow
    from prefect.states import Running

    @flow(name="seis-test")
    def stand_in():
        pass

    with _client() as client:
        return client.create_flow_run(stand_in, name=name, parent_task_run_id=parent_task_run,
                                      state=state or Running(), parameters=parameters or {})


def _task_run(flow_run_id):
    from prefect import task
    from prefect.states import Pending

    @task(name="session")
    def stand_in():
        pass

    with _client() as client:
        return client.create_task_run(stand_in, flow_run_id, dynamic_key=str(time.monotonic_ns()), state=Pending())


def _set(flow_run_id, state) -> None:
    with _client() as client:
        client.set_flow_run_state(UUID(str(flow_run_id)), state, force=True)


def _state(flow_run_id) -> str:
    with _client() as client:
        return client.read_flow_run(UUID(str(flow_run_id))).state.type.value


def _active() -> int:
    with _client() as client:
        return client.read_global_concurrency_limit_by_name(LIMIT).active_slots


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (a zombie runs nothing; this host's init may not reap them)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


# ---- the slot ------------------------------------------------------------------------------------------------------
def test_the_slot_acquisition_refuses_a_cancelled_run_before_and_while_it_waits(home):
    from prefect.states import Cancelling

    from tasks.cancel import RunCancelled
    from tasks.gpu import ensure_gpu_limit
    from tasks.slot_wait import acquire

    ensure_gpu_limit(name=LIMIT)
    cancelled = _flow_run("cancelled").id
    _set(cancelled, Cancelling())
    with pytest.raises(RunCancelled):
        acquire(LIMIT, 60, cancelled)
    assert _active() == 0

    # a gate queued behind another run's: its run is cancelled while it waits, and it never takes the slot
    holder = acquire(LIMIT, 60, _flow_run("holder").id)
    queued, outcome = _flow_run("queued").id, {}

    def wait_for_slot():
        try:
            outcome["lease"] = acquire(LIMIT, 60, queued)
        except RunCancelled as e:
            outcome["refused"] = time.monotonic(), e

    waiter = threading.Thread(target=wait_for_slot)
    try:
        waiter.start()
        time.sleep(1.5)
        assert waiter.is_alive() and _active() == 1
        t0 = time.monotonic()
        _set(queued, Cancelling())
        waiter.join(timeout=15)
        assert "refused" in outcome and outcome["refused"][0] - t0 < 5, outcome
    finally:  # whatever failed above, the next test of this limit must find it free
        if waiter.is_alive():
            _set(queued, Cancelling())
            waiter.join(timeout=30)
        with _client() as client:
            client.release_concurrency_slots_with_lease(holder)
            if "lease" in outcome:
                client.release_concurrency_slots_with_lease(outcome["lease"])
    assert _active() == 0


def test_the_wait_for_a_slot_names_the_holders_run(home):
    from seis.session.resources import Registry
    from tasks.gpu import api_key, registry
    from tasks.slot_wait import describe_holder, waiting_line

    orchestrator = _flow_run("nightly-sync-chain").id
    session = _flow_run("c1/s2", parameters={"request": {"run_dir": "/runs/nightly-0402", "chain": "c1"}}).id
    reg: Registry = registry()
    reg.add_lease("lease-a", str(orchestrator), "c0/s1 build-and-gate", api_key())
    reg.add_lease("lease-b", str(session), "c1/s2 build-and-gate", api_key())
    by_label = {lease.label: lease for lease in reg.leases(api_key())}
    local = describe_holder(by_label["c0/s1 build-and-gate"], run_dir="/runs/nightly-0401")
    remote = describe_holder(by_label["c1/s2 build-and-gate"])
    assert local.startswith("c0/s1 build-and-gate of flow run nightly-sync-chain (")
    assert "run /runs/nightly-0401" in local
    assert remote.startswith("c1/s2 build-and-gate of flow run c1/s2 (") and "run /runs/nightly-0402" in remote
    assert waiting_line("seis-gpu", [local]).endswith(f"held by {local}")


# ---- the watcher ---------------------------------------------------------------------------------------------------
def test_the_cancel_watch_kills_the_runs_process_groups_frees_its_slots_and_cancels_its_sessions(home):
    from prefect.states import Cancelling, Scheduled

    from seis.sandbox.scope import ProcessScope, ScopeClosed
    from tasks.cancel import CancelWatch, RunCancelled, refuse_if_cancelled
    from tasks.gpu import api_key, ensure_gpu_limit, registry
    from tasks.slot_wait import acquire

    ensure_gpu_limit(name=LIMIT)
    run = _flow_run("nightly-chain").id
    lease = acquire(LIMIT, 60, run)
    registry().add_lease(str(lease), str(run), "c0/s0 build-and-gate", api_key())
    dispatched = _task_run(run).id                   # what run_deployment creates in the parent for each session
    running_session = _flow_run("c0/s0", parent_task_run=dispatched).id
    queued_session = _flow_run("c1/s0", parent_task_run=_task_run(run).id, state=Scheduled()).id
    scope = ProcessScope()                            # a dev benchmark: a process group with a child of its own
    bench = scope.popen(["sh", "-c", "sleep 60 & sleep 60"])
    time.sleep(0.2)

    with CancelWatch(run, poll_s=0.2) as watch:
        _set(run, Cancelling())
        t0 = time.monotonic()
        while not watch.requested and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        raise RuntimeError("the session's gate failed: its engines were killed under it")
    assert watch.requested                                          # the error above was the cancellation's
    until(lambda: not _group_alive(bench.pid), 5, "the benchmark's process group killed")
    until(lambda: _active() == 0, 5, "the run's GPU slot released")
    assert time.monotonic() - t0 < 6
    assert not registry().leases(api_key())
    assert _state(running_session) == "CANCELLING"                 # its worker kills it
    assert _state(queued_session) == "CANCELLED"                   # no worker had taken it
    with pytest.raises(RunCancelled):                               # nothing more starts for this run
        refuse_if_cancelled(run, ask_server=False)
    with pytest.raises(ScopeClosed):
        scope.popen(["true"])


# ---- end to end ----------------------------------------------------------------------------------------------------
RUN = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    from prefect import flow, task
    from seis.sandbox.scope import ProcessScope, ScopeClosed
    from tasks.cancel import CancelWatch
    from tasks.cleanup import release_run
    from tasks.gpu import ensure_gpu_limit, gpu_slot

    out = Path(sys.argv[1])

    @task
    def gate(name: str):
        with gpu_slot(name, "seis-gpu-test-cancel"):
            (out / f"{name}.acquired").write_text("")
            scope = ProcessScope()   # as a dev benchmark's: a process group of its own, known to the process
            engine = scope.popen(["sh", "-c", "sleep 300 & sleep 300"], stdout=subprocess.DEVNULL)
            (out / f"{name}.pgid").write_text(str(engine.pid))
            engine.wait()            # killed by the cancellation: the gate ends with no verdict
            raise RuntimeError("the gate's engine was killed")

    @flow(on_cancellation=[release_run], on_crashed=[release_run])
    def run():
        from prefect.runtime import flow_run
        ensure_gpu_limit(name="seis-gpu-test-cancel")
        (out / "flow_run").write_text(str(flow_run.id))
        with CancelWatch(flow_run.id) as cancel:
            first = gate.submit("c0")
            while not (out / "c0.pgid").exists():
                time.sleep(0.1)
            second = gate.submit("c1")      # queued behind c0
            first.wait(); second.wait()
            first.result(); second.result()
        return cancel.cancelled_state("the run") if cancel.requested else "done"

    run()
""")


def test_a_cancelled_flow_stops_its_gate_and_serves_no_queued_gate(home):
    from prefect.settings import PREFECT_API_URL

    from tasks.gpu import ensure_gpu_limit

    ensure_gpu_limit(name=LIMIT)
    out = home / "out"
    out.mkdir()
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_HOME": str(home / "prefect-home"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", RUN, str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        until(lambda: (out / "c0.pgid").exists() or proc.poll() is not None, 90, "the first gate's engine")
        assert proc.poll() is None, proc.communicate()[0]
        flow_run, engine = (out / "flow_run").read_text(), int((out / "c0.pgid").read_text())
        time.sleep(1.0)                                    # the second gate is queued for the slot
        assert _active() == 1 and not (out / "c1.acquired").exists()
        from prefect.states import Cancelling
        with _client() as client:                          # what `prefect flow-run cancel` does
            client.set_flow_run_state(UUID(flow_run), Cancelling(message="cancelled by the test"))
        t0 = time.monotonic()
        until(lambda: not _group_alive(engine), 10, "the gate's engine killed")
        until(lambda: _active() == 0, 10, "the slot freed")
        freed_s = time.monotonic() - t0
        proc.wait(timeout=60)
        log = proc.stdout.read()
        assert freed_s < 6, log
        assert _state(flow_run) == "CANCELLED", log
        assert not (out / "c1.acquired").exists(), log     # the queued gate never took the slot
        assert _active() == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


WAIT_PROBE = """
import signal, sys, threading, time
from flows import seis_flow

class Stop(Exception):
    pass

def on_signal(signum, frame):
    raise Stop

class NeverDone:  # a task run that does not end (a gate whose engines hang)
    def add_done_callback(self, fn):
        pass
    def wait(self, timeout=None):
        threading.Event().wait(timeout)

signal.signal(signal.SIGTERM, on_signal)
helper = threading.Thread(target=lambda: (time.sleep(0.5), signal.pthread_kill(threading.get_ident(), signal.SIGTERM)))
helper.start()
t0 = time.monotonic()
try:
    seis_flow._wait_all([NeverDone()])
except Stop:
    print(f"stopped after {time.monotonic() - t0:.1f} s")
"""


def test_a_signal_another_thread_received_still_stops_the_flows_wait():
    """The kernel may hand a process's SIGINT or SIGTERM to any of its threads; Python runs the handler (which
    kills the engines and ends the run) in the main thread only, once it runs again. The flow's wait for its
    task runs wakes for it: an untimed wait there kept a Ctrl-C'd run waiting for its gate to end on its own."""
    from flows.seis_flow import WAKE_S
    done = subprocess.run([sys.executable, "-c", WAIT_PROBE], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert "stopped after" in done.stdout, done.stdout + done.stderr  # an untimed wait: still waiting at 120 s
    assert float(done.stdout.split()[2]) < 0.5 + 2 * WAKE_S


# ---- status.json: a run's end is not relabelled by a late writer ---------------------------------------------------
ATTEMPT = "attempt-a"


def _ended_run(tmp_path, state: str, **values):
    from seis.session import RunDir
    run = RunDir.create(tmp_path / "run", "{}")
    run.set_status("running", restart=True, flow_run_id=ATTEMPT, sessions_total=2)
    run.set_status(state, flow_run_id=ATTEMPT, **values)
    return run


def _late_cancel(run, monkeypatch, attempt: str | None = None):
    """What the flow does when its cancel watch saw the cancellation only after the run had ended; `attempt`: the
    watch's flow run (default: the one that started the run)."""
    import tasks.cancel as cancel
    monkeypatch.setattr(cancel.flow_runs, "end_task_runs", lambda *a, **k: 0)  # no server in this test
    watch = cancel.CancelWatch(attempt or run.status().flow_run_id)
    cancel.mark_cancelled(watch.flow_run_id)
    return watch.end_run(run)


def test_a_cancellation_that_comes_after_the_run_completed_or_failed_leaves_its_status_as_it_ended(tmp_path,
                                                                                                  monkeypatch):
    """The cancel watch ends the flow Cancelled, but status.json keeps `complete` (every result is written) or the
    failure, with every field as the run wrote it (a resume would not do what the cancelled state's note says)."""
    from seis.session.status import FINISHED_FAILED_NOTE, read_status, write_status
    for state, values in [("complete", {"sessions_done": 2}),
                          ("failed", {"sessions_done": 2, "message": "nothing was judged",
                                      "note": FINISHED_FAILED_NOTE})]:
        run = _ended_run(tmp_path / state, state, **values)
        ended = read_status(run.root)
        assert _late_cancel(run, monkeypatch).is_cancelled()
        assert read_status(run.root) == ended, state
        write_status(run.root, "cancelled", flow_run_id=ATTEMPT, message="the flow run was cancelled")  # its hook
        assert read_status(run.root) == ended, state


def test_an_ended_run_is_not_reopened_or_relabelled_by_a_late_writer_but_a_resume_starts_it_again(tmp_path):
    """Once ended, a run keeps its state against every later writer (a worker's or an earlier attempt's hook, a
    late `complete`), except that the hook may say why an interrupted run stopped (crashed -> cancelled), and a
    resume starts the run again (running)."""
    from seis.session.status import read_status, write_status
    for ended in ("complete", "failed", "cancelled", "crashed"):
        run = _ended_run(tmp_path / ended, ended, sessions_done=1, message=f"it {ended}")
        before = read_status(run.root)
        for late in ("running", "complete", "failed", "cancelled", "crashed"):
            if (ended, late) == ("crashed", "cancelled"):
                continue
            write_status(run.root, late, flow_run_id=ATTEMPT, sessions_done=0, message="late")
            assert read_status(run.root) == before, (ended, late)
        resumed = write_status(run.root, "running", restart=True, flow_run_id="attempt-b", resumes=1, message="")
        assert (resumed.state, resumed.resumes, resumed.sessions_done) == ("running", 1, 1)
    run = _ended_run(tmp_path / "interrupted", "crashed", message="interrupted (SIGTERM)")
    assert write_status(run.root, "cancelled", flow_run_id=ATTEMPT,
                        message="the flow run was cancelled").state == "cancelled"


def test_a_run_whose_sessions_failed_because_it_was_cancelled_says_cancelled(tmp_path, monkeypatch):
    """The watcher kills the run's engines, so its sessions fail under it: that failure is the cancellation's, and
    the run ends `cancelled` (resumable), not `failed`."""
    from uuid import uuid4

    import tasks.cancel as cancel
    from flows.seis_flow import _set_failed
    from seis.session import RunDir
    monkeypatch.setattr(cancel.flow_runs, "end_task_runs", lambda *a, **k: 0)
    run = RunDir.create(tmp_path / "run", "{}")
    watch = cancel.CancelWatch(uuid4())
    run.set_status("running", restart=True, flow_run_id=watch.flow_run_id, sessions_total=2)
    cancel.mark_cancelled(watch.flow_run_id)
    _set_failed(run, watch.flow_run_id, sessions_done=0, message="c0/s0: the gate's engine was killed")
    watch.end_run(run)
    assert run.status().state == "cancelled"


def _hook(run_root, flow_run_id: str, kind: str, monkeypatch, tmp_path):
    """The cleanup hook of flow run `flow_run_id`, as its worker runs it after killing that attempt's process: its
    registry entry still names the run directory (an interrupted attempt leaves it to the hook). No server."""
    from types import SimpleNamespace

    import tasks.cleanup as cleanup
    from seis.session.resources import Registry
    reg = Registry(tmp_path / "registry")
    reg.add_run(flow_run_id, run_root, tmp_path / f"scratch-{flow_run_id}")
    monkeypatch.setattr(cleanup, "registry", lambda: reg)
    monkeypatch.setattr(cleanup, "release_flow_run", lambda *a: 0)
    monkeypatch.setattr(cleanup, "_end_task_runs", lambda *a: 0)
    monkeypatch.setattr(cleanup, "_cancel_children", lambda *a: 0)
    state = SimpleNamespace(is_cancelled=lambda: kind == "cancelled", is_cancelling=lambda: False,
                            message="by the test", type=SimpleNamespace(value=kind.upper()))
    cleanup.release_run(None, SimpleNamespace(id=flow_run_id, name=f"run-{flow_run_id}"), state)


def test_an_earlier_attempts_late_hook_leaves_the_resumed_run_running(tmp_path, monkeypatch):
    """Attempt A is killed (it marked itself crashed) and resumed by attempt B, which writes `running`; A's cleanup
    hook, run by its worker seconds later, arrives only then. Its `cancelled` or `crashed` is A's and does not end
    B's live run (before: `running` may become anything, so the live run read cancelled); B's own hook, a cancel
    watch's end of B and B's end are still written."""
    from seis.session import RunDir
    from seis.session.status import read_status
    for kind in ("cancelled", "crashed"):
        run = RunDir.create(tmp_path / kind / "run", "{}")
        run.set_status("running", restart=True, flow_run_id="attempt-a", sessions_total=2)
        run.set_status("crashed", flow_run_id="attempt-a", message="interrupted (SIGTERM)")
        run.set_status("running", restart=True, flow_run_id="attempt-b", resumes=1, message="")
        live = read_status(run.root)
        _hook(run.root, "attempt-a", kind, monkeypatch, tmp_path / kind)
        assert read_status(run.root) == live, kind
        _hook(run.root, "attempt-b", kind, monkeypatch, tmp_path / kind)
        assert read_status(run.root).state == kind
    run = RunDir.create(tmp_path / "watch" / "run", "{}")
    run.set_status("running", restart=True, flow_run_id="attempt-b", sessions_total=2)
    _late_cancel(run, monkeypatch, "attempt-c")  # the cancel watch of another flow run than B: its end is not B's
    assert run.status().state == "running"
    for late in ("complete", "failed", "crashed"):  # an earlier attempt's flow, still writing its own end
        run.set_status(late, flow_run_id="attempt-a", message="late")
        assert run.status().state == "running", late
    with pytest.raises(TypeError):  # and no writer can leave its attempt unsaid (it was then always taken)
        run.set_status("complete", message="late")
