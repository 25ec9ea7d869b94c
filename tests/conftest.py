"""Shared fixtures: prepared models, the vanilla engine package (E0), a process standing in for an engine."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from prefect_workers import drain_api_workers

from seis.engine_import import ENGINE_TEMPLATE, import_engine
from tasks.gpu import OWN_SERVER_ENV

# One intra-op thread in each test process: the suite's three workers and their engines keep both cores busy, and
# a second thread only spins waiting for the first (the SmolLM2-vs-HF test: 26.8 s of CPU with two, 19.0 s with
# one, 18 s wall either way on an idle machine).
torch.set_num_threads(1)


# The test modules that take longest, longest first: with the suite spread over workers a module at a time
# (pyproject's `-n 3 --dist loadfile`), they start first, so none is left running alone at the end.
EXPENSIVE_MODULES = ("test_scale_out.py", "test_resume.py", "test_prefect_server.py", "test_flow.py",
                     "test_adversarial.py", "test_eos_probes.py", "test_postval.py", "test_agent_confinement.py",
                     "test_evaluator.py", "test_run_states.py", "test_store_failures.py", "test_gate_contract.py",
                     "test_host_boundary.py", "test_llm_agents.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(EXPENSIVE_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept within a module


# Which Prefect server and home a process talks to. A test that leaves one of them changed in os.environ sends every
# later test of its worker process (and their threads, which do not see the harness's settings context) to that
# server: "Connection refused" far from the test that caused it.
SERVER_ENV = ("PREFECT_API_URL", "PREFECT_HOME", OWN_SERVER_ENV)


@pytest.fixture(autouse=True)
def _server_env_left_as_found() -> Iterator[None]:
    before = {key: os.environ.get(key) for key in SERVER_ENV}
    yield
    after = {key: os.environ.get(key) for key in SERVER_ENV}
    assert after == before, f"the test left the Prefect server settings of this process changed: {before} -> {after}"


@pytest.fixture(scope="session")
def E():
    """The E0 engine package (`engine`), imported from engine_template/."""
    return import_engine(ENGINE_TEMPLATE)


@pytest.fixture(scope="session")
def prepared_dir() -> Path:
    """The prepared workloads (data/prepared), made from the GSM8K source on first use."""
    from seis.workloads import WorkloadDataError, ensure_prepared
    try:
        return ensure_prepared()
    except WorkloadDataError as e:  # no GSM8K source on this machine (../shared/data/gsm8k or $SEIS_GSM8K_DIR)
        pytest.skip(f"no prepared workloads and no GSM8K source: {e}")


@pytest.fixture
def engine_pid() -> Iterator[int]:
    """The pid of an idle child process, for tests that watch how engine processes are pinned. Needs two CPUs:
    with one, pinned and unpinned look the same."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a pinned mask cannot be told from an unpinned one")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def harness(tmp_path_factory):
    """One Prefect server for the whole test run (started by the first test that asks for it), on a database of
    its own: every flow run of the suite talks to the same URL, so no client is left pointing at a server an
    earlier module stopped. Start-up may take long on a busy 2-core machine: 180 s.

    Not Prefect's prefect_test_harness: on exit it drains every event and log worker of the process without a
    bound, and one left pointing at a server a test has since stopped (the scale-out tests run flows against
    servers of their own) never drains, so the suite hung there. Here the drain is bounded, then the server stops."""
    import flows  # noqa: F401  (SEIS's Prefect settings, before the server starts)
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_DATABASE_CONNECTION_URL,
                                  PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings)

    from flows.local_server import seed_database
    home = tmp_path_factory.mktemp("prefect-home")  # this run's own: the GPU slot registry lives there
    db = seed_database(home)                        # migrated already, as `seis evolve`'s own server's is
    with temporary_settings({PREFECT_SERVER_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{db}",
                             PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 180}):
        server = SubprocessASGIServer()
        server.start(timeout=180)
        try:
            with temporary_settings({PREFECT_API_URL: server.api_url, PREFECT_HOME: home}):
                yield server.api_url
                drain_api_workers()
        finally:
            server.stop()
