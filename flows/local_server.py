"""A Prefect server of its own for a `seis evolve` run that names no PREFECT_API_URL.

Prefect's built-in temporary server is a child in the caller's process group, so Ctrl-C in a terminal (or
`timeout`, or a supervisor signalling the group) kills the API while the flow is still ending: the run then hangs,
retrying its GPU-slot lease against a server that is gone. This one is `prefect server start` in a session of its
own, with its home and database under the run directory (`run_home`), whatever PREFECT_HOME or database settings
the operator's environment holds: those may be a shared server's, and two servers on one database would each
act on the other's runs and GPU slots. It is stopped at interpreter exit, after Prefect's own exit handlers have
flushed their events to it, and it dies with the run's process if that is killed.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# settings that say which database a server opens (PREFECT_SERVER_DATABASE_*; PREFECT_API_DATABASE_* are aliases)
_DATABASE_KEYS = ("CONNECTION_URL", "DRIVER", "HOST", "PORT", "USER", "PASSWORD", "NAME")


class ServerError(RuntimeError):
    """The local Prefect server did not come up."""


def _die_with_parent() -> None:  # in the child, before exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


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

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the server's process group, SIGKILL what is left after grace_s."""
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
    return f"sqlite+aiosqlite:///{Path(home).resolve() / 'prefect.db'}"


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
    it answers."""
    home.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = server_env(home)
    log = home / "server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
    server = LocalServer(f"http://127.0.0.1:{port}/api", proc, log)
    deadline = time.monotonic() + startup_s
    while not _healthy(server.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited with {proc.returncode}" if proc.poll() is not None else f"no answer in {startup_s:.0f} s"
            server.stop()
            tail = log.read_text(errors="replace")[-2000:]
            raise ServerError(f"the local Prefect server ({server.url}) {why}; {log}:\n{tail}")
        time.sleep(0.25)
    return server
