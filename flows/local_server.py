"""A Prefect server of its own for a `seis evolve` run that names no PREFECT_API_URL.

Prefect's built-in temporary server is a child in the caller's process group, so Ctrl-C in a terminal (or
`timeout`, or a supervisor signalling the group) kills the API while the flow is still ending: the run then hangs,
retrying its GPU-slot lease against a server that is gone. This one is `prefect server start` in a session of its
own, with its home and database under the run directory (`run_home`), whatever PREFECT_HOME or database settings
the operator's environment holds: those may be a shared server's, and two servers on one database would each
act on the other's runs and GPU slots. It is stopped at interpreter exit, after Prefect's own exit handlers have
flushed their events to it, and it dies with the run's process if that is killed.

A new home's database is a copy of an empty, fully migrated one (`seed_database`): a server that opens a new
SQLite file first runs every Alembic migration of its Prefect version, about half its start-up CPU (13 s of CPU on
a new file, 6 s on a migrated copy, on a loaded 2-core machine). The migrated file is made once per Prefect
version, in the SEIS cache. A home that has a database (a resumed run's) keeps it.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

DATABASE = "prefect.db"      # the file `prefect server start` opens in $PREFECT_HOME
HOME_LOCK = "server.lock"    # held by the process whose server uses the home: one server per database
_PR_SET_PDEATHSIG = 1
# settings that say which database a server opens (PREFECT_SERVER_DATABASE_*; PREFECT_API_DATABASE_* are aliases)
_DATABASE_KEYS = ("CONNECTION_URL", "DRIVER", "HOST", "PORT", "USER", "PASSWORD", "NAME")


class ServerError(RuntimeError):
    """The local Prefect server did not come up."""


# `python -m prefect` that dies with the process that started it (SIGTERM at its exit). Set here, not in a
# preexec_fn: with one, Python runs its at-fork hooks around the fork, and a Ctrl-C that lands in one of them is
# printed and dropped (the run went on).
_SERVE = ("import ctypes, os, runpy, signal, sys\n"
          f"ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, signal.SIGTERM)\n"
          "if os.getppid() != int(sys.argv[1]):\n"
          "    sys.exit('the process that started this server has ended')\n"
          "sys.argv = ['prefect', *sys.argv[2:]]\n"
          "runpy.run_module('prefect', run_name='__main__', alter_sys=True)\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@dataclass
class LocalServer:
    url: str          # the API URL (…/api)
    proc: subprocess.Popen
    log: Path
    home_lock: int = -1   # the descriptor holding HOME_LOCK: released once the server is gone (or this process is)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the server's process group, SIGKILL what is left after grace_s; then the home is free."""
        try:
            self._end(grace_s)
        finally:
            if self.home_lock >= 0:
                os.close(self.home_lock)
                self.home_lock = -1

    def _end(self, grace_s: float) -> None:
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


def run_home(run_dir: Path) -> Path:
    """The home of a run's own server: in the run directory, so that a resume opens the same database."""
    return Path(run_dir) / ".prefect"


def database_url(home: Path) -> str:
    return f"sqlite+aiosqlite:///{Path(home).resolve() / DATABASE}"


def server_env(home: Path) -> dict[str, str]:
    """The server's environment: the caller's, without its API URL or any database setting, with home and its own
    database file."""
    database = {f"PREFECT_{scope}_DATABASE_{key}" for scope in ("SERVER", "API") for key in _DATABASE_KEYS}
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL" and k not in database}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_DATABASE_CONNECTION_URL=database_url(home),
               PREFECT_UI_ENABLED="false", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return env


def start_local_server(home: Path, startup_s: float = 120.0) -> LocalServer:
    """`prefect server start` on a free loopback port with PREFECT_HOME=home and its database in it; returns once
    it answers. A home another process's server is using (`seis evolve --resume` of one run in two terminals) is a
    ServerError at once: two servers on one SQLite database fail each other, and the second one's crash printed
    its whole log tail."""
    home.mkdir(parents=True, exist_ok=True)
    lock = _lock_home(home)
    try:
        return _start(home, startup_s, lock)
    except BaseException:
        os.close(lock)
        raise


def _lock_home(home: Path) -> int:
    fd = os.open(home / HOME_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ServerError(f"{home} is in use by another process's Prefect server (another `seis evolve` on this run "
                          f"directory); wait for it to end or stop it first") from None
    return fd


def _start(home: Path, startup_s: float, lock: int) -> LocalServer:
    log = home / "server.log"
    try:
        seed_database(home)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:  # slower, not broken: the server migrates it
        with log.open("a") as out:
            out.write(f"no migrated database to copy, the server makes its own: {e}\n")
    port = _free_port()
    env = server_env(home)
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(os.getpid()), "server", "start", "--host",
                                 "127.0.0.1", "--port", str(port)], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = LocalServer(f"http://127.0.0.1:{port}/api", proc, log, lock)
    try:
        _wait_healthy(server, startup_s)
    except BaseException:   # Ctrl-C while it starts, too: no server is left behind; the caller releases the home
        server._end(10.0)
        raise
    return server


def _wait_healthy(server: LocalServer, startup_s: float) -> None:
    deadline = time.monotonic() + startup_s
    while not _healthy(server.url):
        if server.proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited with {server.proc.returncode}" if server.proc.poll() is not None else \
                f"no answer in {startup_s:.0f} s"
            tail = server.log.read_text(errors="replace")[-2000:]
            raise ServerError(f"the local Prefect server ({server.url}) {why}; {server.log}:\n{tail}")
        time.sleep(0.25)


def seed_database(home: Path) -> Path:
    """home/prefect.db: a copy of the migrated template unless it exists already. Returns its path."""
    db = Path(home) / DATABASE
    if db.exists():
        return db
    db.parent.mkdir(parents=True, exist_ok=True)
    partial = db.with_name(f".{DATABASE}.{os.getpid()}.partial")
    shutil.copyfile(migrated_template(), partial)
    os.replace(partial, db)   # a server never opens a half-copied file
    return db


def migrated_template() -> Path:
    """The empty database at this Prefect version's newest migration, made on first use (one maker at a time)."""
    import filelock

    from seis.models.cache import cache_dir
    template = cache_dir() / "prefect-db" / f"prefect-{version('prefect')}.db"
    if template.exists():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(template.with_suffix(".lock")):
        if not template.exists():
            with tempfile.TemporaryDirectory(dir=template.parent) as tmp:
                made = Path(tmp) / DATABASE
                _upgrade(made)
                os.replace(made, template)
    return template


def _upgrade(db: Path) -> None:
    """`prefect server database upgrade` on a new file, with a home of its own (nothing of the caller's)."""
    env = server_env(db.parent)   # its database: db.parent / DATABASE
    done = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not db.is_file():
        raise RuntimeError(f"could not migrate a new Prefect database ({db}):\n{(done.stdout + done.stderr)[-2000:]}")
