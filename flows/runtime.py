"""Prefect settings SEIS runs with unless the environment says otherwise. They must be in the environment before
`prefect` is first imported (its settings are read then): `flows/__init__.py` applies them, and `seis evolve`
calls `apply()` before it imports the flow.

- a temporary server (a flow run in-process without PREFECT_API_URL; `seis evolve` starts a server of its own,
  flows/local_server.py) gets 120 s to start: its default 20 s is not enough on a loaded 2-core machine
  ("Timed out while attempting to connect to ephemeral Prefect API");
- its SQLite database waits 60 s for a lock instead of failing with "database is locked";
- no telemetry or analytics leave the machine (DO_NOT_TRACK for the client, the server's analytics off,
  Prefect Cloud's orchestration telemetry off);
- the temporary server has a database file of its own, `$PREFECT_HOME/seis-ephemeral.db`, unless a database is
  configured: Prefect's default, `$PREFECT_HOME/prefect.db`, is the one `prefect server start` opens in that home,
  a shared server's when PREFECT_HOME is its, and two servers on one database act on each other's runs and slots.
"""
from __future__ import annotations

import os
from pathlib import Path

DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_DATABASE_TIMEOUT": "60",
    "PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT": "30",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    "DO_NOT_TRACK": "1",
}


EPHEMERAL_DATABASE = "seis-ephemeral.db"
DATABASE_SETTINGS = tuple(f"PREFECT_{scope}_DATABASE_{key}" for scope in ("SERVER", "API")
                          for key in ("CONNECTION_URL", "DRIVER", "HOST", "NAME"))


def apply() -> None:
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    _own_ephemeral_database()


def _own_ephemeral_database() -> None:
    """Only where a flow would start Prefect's temporary server (no API URL) and no database is configured."""
    if os.environ.get("PREFECT_API_URL") or any(os.environ.get(name) for name in DATABASE_SETTINGS):
        return
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser().resolve()
    os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{home / EPHEMERAL_DATABASE}"


class _ThreadTimeoutNotice:
    """Prefect warns on every task run with a timeout that runs in a worker thread (all of a session's steps) that
    the timeout cannot interrupt blocking calls. For SEIS it still acts: the steps' blocking calls have their own
    limits (every engine call, the gate's deadline, the agent's wall clock), after which the timeout fires. The
    warning says nothing new about any one run, so it is dropped."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Timeout of %s seconds configured for this task, but the task is "
                                              "running in a worker thread")


def quiet_thread_timeout_notice() -> None:
    import logging
    logger = logging.getLogger("prefect.task_runs")
    if not any(isinstance(f, _ThreadTimeoutNotice) for f in logger.filters):
        logger.addFilter(_ThreadTimeoutNotice())
