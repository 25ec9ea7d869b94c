"""Process handling around a run: workers started by scripts/one-host-workers.sh stop on one SIGTERM, and `down`
ends their sessions in flight before them (the server last); a resumed run marks the attempt it continues Crashed
and links to it; a run's own Prefect server never opens the database of the PREFECT_HOME it was given. About 15 s
on 2 cores, plus the module's Prefect test server for the resume test."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from uuid import UUID

import pytest

import flows  # noqa: F401  (SEIS's Prefect settings, before the test server starts)
from polling import until

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "one-host-workers.sh"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"   # this host's init may leave zombies unreaped


def _start_as_the_script_does(state: Path, name: str, code: str, *args: str) -> int:
    """`start NAME python3 -c CODE ARGS` of the sourced script, run from a non-interactive bash as `up` is (its `&`
    jobs inherit SIGINT ignored); returns the pid it recorded."""
    subprocess.run(["bash", "-c", f'source "{SCRIPT}"; state="$1"; shift; start "$@"', "bash", str(state), name,
                    sys.executable, "-c", code, *args], check=True, timeout=30)
    return int((state / f"{name}.pid").read_text())


# ---- workers and `down` --------------------------------------------------------------------------------------------
WORKER = textwrap.dedent("""
    import os, sys, time
    from prefect.utilities.processutils import setup_signal_handlers_worker
    setup_signal_handlers_worker(os.getpid(), "the process worker", print)   # as `prefect worker start` does
    open(sys.argv[1], "w").write("ready")
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        sys.exit(0)
""")


def test_a_worker_the_script_starts_stops_on_one_sigterm(tmp_path):
    ready = tmp_path / "ready"
    pid = _start_as_the_script_does(tmp_path, "worker-0", WORKER, str(ready))
    try:
        until(lambda: ready.exists(), 60, "the worker's signal handlers")
        os.killpg(pid, signal.SIGTERM)
        until(lambda: not _alive(pid), 5, "the worker stopped by SIGTERM")
    finally:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)


RECORDS_SIGTERM = """
import signal, sys, time

def stop(*_):
    open(sys.argv[1], "w").write(repr(time.time()))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
"""
SERVER = RECORDS_SIGTERM + "open(sys.argv[2], 'w').write('ready')\ntime.sleep(120)\n"
# a worker whose flow run is a child in a session of its own, as Prefect's process worker starts it (its command line
# ends as a flow run's, `python -m prefect.engine`), beside a child that is not a flow run
WORKER_WITH_SESSION = RECORDS_SIGTERM + textwrap.dedent("""
    import subprocess
    session = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[2], sys.argv[4], "-m", "prefect.engine"],
                               start_new_session=True)
    other = subprocess.Popen(["sleep", "120"])
    time.sleep(120)
""")


def test_down_ends_the_sessions_in_flight_first_then_the_workers_then_the_server(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    ended = {name: tmp_path / f"{name}.ended" for name in ("server", "worker", "session")}
    ready = {name: tmp_path / f"{name}.ready" for name in ("server", "session")}
    server = _start_as_the_script_does(state, "server", SERVER, str(ended["server"]), str(ready["server"]))
    worker = _start_as_the_script_does(state, "worker-0", WORKER_WITH_SESSION, str(ended["worker"]),
                                       str(ended["session"]), SERVER, str(ready["session"]))
    try:
        until(lambda: all(p.exists() for p in ready.values()), 30, "the server and the session")
        t0 = time.monotonic()
        down = subprocess.run(["bash", str(SCRIPT), "down", "--state", str(state)], capture_output=True, text=True,
                              timeout=120)
        assert down.returncode == 0, down.stderr
        assert time.monotonic() - t0 < 10, down.stderr
        times = {name: float(path.read_text()) for name, path in ended.items()}   # each ended on SIGTERM
        assert times["session"] <= times["worker"] <= times["server"], times
        assert not list(state.glob("*.pid")) and not _alive(server) and not _alive(worker)
    finally:
        for pid in (server, worker):
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)


# ---- a run's own server --------------------------------------------------------------------------------------------
def test_a_runs_own_server_opens_its_own_database_whatever_prefect_home_says(tmp_path, monkeypatch):
    import flows.local_server as local_server
    from seis import cli
    from tasks.gpu import OWN_SERVER_ENV

    shared = tmp_path / "shared-home"         # a team server's home, exported in the operator's shell
    monkeypatch.setenv("PREFECT_HOME", str(shared))
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", f"sqlite+aiosqlite:///{shared}/prefect.db")
    for key in ("PREFECT_API_URL", OWN_SERVER_ENV):  # _prefect_api sets both in os.environ: set here first, so
        monkeypatch.setenv(key, "")                   # that the undo removes them (a delenv of an unset key
        monkeypatch.delenv(key)                       # records nothing, and the next tests of this process
                                                      # would talk to port 9)
    started = []
    monkeypatch.setattr(local_server, "start_local_server",
                        lambda home: started.append(home) or SimpleNamespace(url="http://127.0.0.1:9/api",
                                                                             stop=lambda: None))
    run = tmp_path / "run"
    cli._prefect_api(run)
    assert started == [run / ".prefect"] and os.environ["PREFECT_HOME"] == str(run / ".prefect")
    env = local_server.server_env(started[0])
    assert env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == f"sqlite+aiosqlite:///{run.resolve()}/.prefect/prefect.db"
    assert env["PREFECT_HOME"] == str(run / ".prefect") and "PREFECT_API_URL" not in env


def test_a_home_whose_server_another_process_runs_is_refused_in_one_line_and_free_once_it_is_gone(tmp_path):
    """`seis evolve --resume` of one run in two terminals: each started a server on the run's database, and the
    second crashed with its whole log tail printed. Now the second is refused at once, starting nothing; once the
    first process is gone (killed: the kernel releases its lock) the home is free again."""
    from flows.local_server import HOME_LOCK, ServerError, start_local_server
    home = tmp_path / "run" / ".prefect"
    home.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(home / HOME_LOCK)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ServerError) as refused:
            start_local_server(home, startup_s=5)
        assert len(str(refused.value).splitlines()) == 1 and "another `seis evolve`" in str(refused.value)
        assert sorted(p.name for p in home.iterdir()) == [HOME_LOCK]   # no server, no database, no log
    finally:
        holder.kill()
        holder.wait()
    import fcntl
    fd = os.open(home / HOME_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # free again
    finally:
        os.close(fd)


def test_the_runs_own_server_dies_with_the_run_killed_outright(tmp_path):
    """A run's process killed with SIGKILL runs no exit handler; its Prefect server (in a session of its own, out
    of reach of a signal to the run's process group) still ends, for the kernel tells it its parent is gone."""
    home = tmp_path / "run" / ".prefect"
    run = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from flows.local_server import start_local_server
        server = start_local_server(Path({str(home)!r}))
        print(server.proc.pid, flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        server_pid = int(run.stdout.readline())
        assert os.getpgid(server_pid) != os.getpgid(run.pid)
    finally:
        run.kill()
        run.wait()
    deadline = time.monotonic() + 30
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server_pid), "the server outlived the run that started it"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_new_home_gets_a_migrated_database_and_a_resumed_one_keeps_its_own(tmp_path):
    """The copy is Prefect's schema at its newest migration (the file `prefect server start` would have made);
    an existing database is never replaced (a resumed run's holds its flow runs and GPU slot)."""
    import sqlite3

    from flows.local_server import DATABASE, migrated_template, seed_database
    db = seed_database(tmp_path / "new-home")
    assert db == tmp_path / "new-home" / DATABASE and db.read_bytes() == migrated_template().read_bytes()
    with sqlite3.connect(db) as con:
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        (revision,) = con.execute("SELECT version_num FROM alembic_version").fetchone()
    assert {"flow_run", "task_run", "deployment", "work_pool", "concurrency_limit_v2"} <= tables
    import prefect.server.database
    from alembic.script import ScriptDirectory
    migrations = Path(prefect.server.database.__file__).parent / "_migrations"
    assert revision == ScriptDirectory(str(migrations),
                                       version_locations=[str(migrations / "versions" / "sqlite")]).get_current_head()

    kept = tmp_path / "resumed-home" / DATABASE
    kept.parent.mkdir()
    kept.write_bytes(b"a run's own database")
    assert seed_database(kept.parent) == kept and kept.read_bytes() == b"a run's own database"
    assert not list(kept.parent.glob(".*partial"))


def test_a_temporary_server_does_not_open_the_prefect_homes_database(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "shared-home"), PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", "import flows\nfrom prefect.settings import get_current_settings\n"
                           "print(get_current_settings().server.database.connection_url.get_secret_value())"],
                          env=env, capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == f"sqlite+aiosqlite:///{tmp_path.resolve()}/shared-home/seis-ephemeral.db"


# ---- resume --------------------------------------------------------------------------------------------------------
def _flow_run(name: str, parent_task_run=None):
    from prefect import flow, get_client
    from prefect.states import Running

    @flow(name="seis-test")
    def stand_in():
        pass

    with get_client(sync_client=True) as client:
        return client.create_flow_run(stand_in, name=name, parent_task_run_id=parent_task_run, state=Running())


def _task_run(flow_run_id):
    from prefect import get_client, task
    from prefect.states import Running

    @task(name="c0/s1 build-and-gate")
    def stand_in():
        pass

    with get_client(sync_client=True) as client:
        return client.create_task_run(stand_in, flow_run_id, dynamic_key=str(time.monotonic_ns()), state=Running())


def test_a_resume_marks_the_attempt_it_continues_crashed_and_links_to_it(harness, tmp_path):
    from prefect import get_client

    from seis.session.rundir import RunDir
    from tasks.attempts import RESUMES_TAG, begin_attempt

    run = RunDir.create(tmp_path / "run", "{}")
    killed = _flow_run("killed-attempt").id                 # a `seis evolve` SIGKILLed against a shared server
    gate = _task_run(killed).id
    session = _flow_run("c0/s1", parent_task_run=_task_run(killed).id).id   # its session on a worker
    assert begin_attempt(run, str(killed), resumed=False) is None            # what it recorded as it began
    resumed = _flow_run("resumed-attempt").id
    assert begin_attempt(run, str(resumed), resumed=True) == str(killed)
    with get_client(sync_client=True) as client:
        old = client.read_flow_run(killed)
        assert old.state.type.value == "CRASHED" and f"resumed by flow run {resumed}" in old.state.message
        assert client.read_task_run(gate).state.type.value == "CRASHED"
        assert client.read_flow_run(session).state.type.value == "CANCELLING"
        assert RESUMES_TAG.format(killed) in client.read_flow_run(resumed).tags
    attempts = run.attempts()
    assert [UUID(a["flow_run_id"]) for a in attempts] == [killed, resumed] and attempts[1]["resumes"] == str(killed)
    # a later resume leaves the finished attempts as they are
    again = _flow_run("second-resume").id
    assert begin_attempt(run, str(again), resumed=True) == str(resumed)
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(killed).state.message == old.state.message
        assert client.read_flow_run(resumed).state.type.value == "CRASHED"      # it was Running: its process is gone
