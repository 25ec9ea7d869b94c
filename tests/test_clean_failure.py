"""Clean failure: an engine the OOM killer ended is a host failure (never a candidate rejection), one that killed
itself is not, a run that cannot fit in memory is refused with the numbers, the GPU slot is released when its holder
crashes or is killed, and the tree hash is one function for the workspace, the store and the evaluator."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import flows  # noqa: F401  (SEIS's Prefect settings, before the test server starts)
from seis.engine_import import ENGINE_TEMPLATE
from seis.run_config import RunConfig


# ---- host failure --------------------------------------------------------------------------------------------------
def _engine(tmp_path: Path, init: str) -> Path:
    engine = tmp_path / "engine-under-test"
    shutil.copytree(ENGINE_TEMPLATE, engine, ignore=shutil.ignore_patterns("__pycache__"))
    (engine / "engine" / "__init__.py").write_text(init)
    return engine


def _handle(engine: Path, trusted: bool = False, **isolation):
    from seis.evaluator.engines import Deadline, EngineHandle
    from seis.evaluator.gate_config import IsolationConfig
    from seis.evaluator.isolation import make_isolation
    from seis.models import resolve_model
    return EngineHandle("candidate", engine, resolve_model("tiny-qwen3"), {"device": "cpu"},
                        make_isolation("cpu", IsolationConfig(**isolation)), Deadline(120), 60, 60, trusted=trusted)


def _failed_build(engine: Path, **isolation) -> list:
    """The failures an untrusted engine's build records (the build must fail, and raise nothing)."""
    handle = _handle(engine, **isolation)
    try:
        handle.start()
        assert handle.build() is None
        return handle.failures
    finally:
        handle.close()


SELF_KILL = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"


def _oom_counter(monkeypatch, *counts: int) -> None:
    """The kernel's OOM-kill count as the engine host reads it: counts[0] at the engine's start, then the rest."""
    from seis.sandbox import cgroup
    seen = list(counts)
    monkeypatch.setattr(cgroup, "host_oom_kills", lambda: seen.pop(0) if len(seen) > 1 else seen[0])


def test_an_engine_killed_while_the_oom_killer_struck_is_a_host_failure_not_a_failed_check(tmp_path, monkeypatch):
    from seis.evaluator import HostFailure
    _oom_counter(monkeypatch, 5, 6)  # the SIGKILL stands for the OOM killer's, which the kernel counted
    handle = _handle(_engine(tmp_path, SELF_KILL))
    try:
        handle.start()
        with pytest.raises(HostFailure, match="killed by the host during 'build'.*OOM"):
            handle.build()
        assert handle.failures == []                                  # nothing charged to the candidate
    finally:
        handle.close()


def test_an_engine_that_kills_itself_cannot_pass_for_a_host_failure(tmp_path, monkeypatch):
    """SIGKILL is also what a candidate can send itself: with no OOM kill on the host's record it is the
    candidate's failure, so a hostile engine cannot stop the run (a host failure ends it with no verdict)."""
    _oom_counter(monkeypatch, 5)
    [failure] = _failed_build(_engine(tmp_path, SELF_KILL))
    assert "the engine's own doing" in failure.message


def test_which_sigkills_are_the_hosts():
    from seis.engine_host.client import EngineExited
    host = [EngineExited("x", code, oom, watch, bound).killed_by_host
            for code, oom, watch, bound in [(-9, True, False, False), (137, None, False, False),
                                            (-9, False, False, False), (-9, True, True, False),
                                            (-9, True, False, True), (1, True, False, False),
                                            (None, True, False, False)]]
    # the OOM killer struck, or the kernel keeps no count: the host's; none struck, the write watch's kill, a kill
    # at the sandbox's own memory bound, or any other end: the engine's own
    assert host == [True, True, False, False, False, False, False]


# Fills the sandbox's RAM-backed /tmp, 64 MiB at a time: host memory that no per-process limit (RLIMIT_AS) counts.
TMP_HOG = ("with open('/tmp/hog', 'wb') as f:\n"
           "    for _ in range(48):\n"
           "        f.write(b'\\1' * 2**26)\n")


@pytest.mark.skipif(not __import__("seis.sandbox.cgroup", fromlist=["can_cage"]).can_cage(),
                    reason="this host lets SEIS make no memory cgroup; the memory watch that stands in for one "
                           "counts processes, not /tmp (tests/test_sandbox.py tries the watch)")
def test_an_engine_past_its_sandboxs_memory_bound_is_its_own_failure_not_the_hosts(tmp_path):
    """A candidate that holds more host memory than its sandbox's bound (3 GiB of RAM-backed /tmp against 1 GiB)
    is killed inside its own sandbox, and that is its failed check, never a host failure that would end the run
    with no verdict (the kernel counts that kill among the host's OOM kills too)."""
    [failure] = _failed_build(_engine(tmp_path, TMP_HOG), sandbox_memory_gb=1.0)
    assert "memory bound (1.0 GiB" in failure.message and "the kernel killed" in failure.message


def test_an_engine_that_fails_on_its_own_is_the_candidates_failure(tmp_path):
    [failure] = _failed_build(_engine(tmp_path, "raise SystemExit(3)\n"))
    assert "exit status 3" in failure.message


def test_the_session_reports_a_host_failure_and_records_no_verdict(tmp_path, monkeypatch):
    import seis.session.steps as steps
    from seis.evaluator import GateInputError, HostFailure, ReferenceFailure
    from seis.session import SessionSpec, judge

    spec = SessionSpec(run_id="r", chain="c0", chain_index=0, session=0, parent_snapshot="0" * 16,
                       session_dir=tmp_path)
    cases = [(HostFailure("the candidate engine was killed by the host"), "host failure"),
             (ReferenceFailure("the vanilla engine failed"), "no verdict")]
    for error, words in cases:
        monkeypatch.setattr(steps, "gate_workspace", lambda *a, error=error: (_ for _ in ()).throw(error))
        j = judge(RunConfig(), spec, None, tmp_path)
        assert j.gate_result is None and j.reasons == () and words in j.host_failure
    monkeypatch.setattr(steps, "gate_workspace", lambda *a: (_ for _ in ()).throw(GateInputError("a FIFO")))
    j = judge(RunConfig(), spec, None, tmp_path)                      # a refusal is a rejection, with its reason
    assert not j.host_failure and j.reasons == ("gate refused the workspace: a FIFO",)
    passed = SimpleNamespace(verdict="fail", failed_checks=["dev.kl"])
    monkeypatch.setattr(steps, "gate_workspace", lambda *a: passed)
    assert judge(RunConfig(), spec, None, tmp_path).reasons == ("dev.kl",)


# ---- memory preflight ----------------------------------------------------------------------------------------------
def test_a_run_that_cannot_fit_is_refused_naming_the_numbers(tmp_path):
    from seis.session.preflight import GiB, InsufficientMemory, check_gate_memory, preflight_run

    config = RunConfig(model="tiny-qwen3", gate="full", device="cpu", out=tmp_path / "run", store=tmp_path / "s")
    est = check_gate_memory(config, available_bytes=64 * GiB, on_cpu=True)
    assert est.engines == 3 and est.kv_tokens == 32 * 512          # max_batch_size x the model's 512 positions
    assert est.kv_bytes == est.kv_tokens * 2 * 2 * 2 * 16 * 4      # K+V x layers x kv heads x head_dim x fp32
    with pytest.raises(InsufficientMemory) as refused:
        check_gate_memory(config, available_bytes=GiB, on_cpu=True)
    message = str(refused.value)
    for words in ("3 engines", "weights", "KV cache", "16384 tokens", "1.0 GiB available", "GiB in all"):
        assert words in message, message
    # the whole preflight refuses too, and leaves no output dir behind
    import seis.session.preflight as preflight
    original = preflight.check_gate_memory
    try:
        preflight.check_gate_memory = lambda c: original(c, available_bytes=GiB, on_cpu=True)
        with pytest.raises(InsufficientMemory):
            preflight_run(config)
        # dispatch=workers: the gates run on the workers, which check their own memory before each session
        assert preflight_run(config.model_copy(update={"dispatch": "workers", "out": tmp_path / "w"})) is None
    finally:
        preflight.check_gate_memory = original
    assert not (tmp_path / "run").exists()


# ---- the GPU slot --------------------------------------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from prefect import flow, task
    from tasks.cleanup import release_run
    from tasks.gpu import ensure_gpu_limit, gpu_slot

    @task
    def hold(marker: str):
        with gpu_slot("test holder"):
            Path(marker).write_text("held")
            time.sleep(300)

    @flow(on_crashed=[release_run], on_cancellation=[release_run])
    def holder(marker: str):
        ensure_gpu_limit()
        hold(marker)

    holder(sys.argv[1])
""")


def _active_slots() -> int:
    from prefect import get_client
    from tasks.gpu import GPU_LIMIT
    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(GPU_LIMIT).active_slots


def _hold_then(tmp_path: Path, sig: int) -> None:
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME
    marker = tmp_path / f"held-{sig}"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_HOME": str(PREFECT_HOME.value()),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(marker)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else ""
        time.sleep(0.2)
    assert _active_slots() == 1
    proc.send_signal(sig)
    proc.wait(timeout=60)


def test_the_gpu_slot_is_released_when_its_holder_crashes_or_is_killed(harness, tmp_path):
    from tasks.gpu import ensure_gpu_limit, registry
    ensure_gpu_limit()
    # SIGTERM (a worker stopping the flow run, a cancellation): the flow crashes and its hook releases the slot
    t0 = time.monotonic()
    _hold_then(tmp_path, signal.SIGTERM)
    assert _active_slots() == 0 and time.monotonic() - t0 < 60
    # SIGKILL: no hook can run; the next run releases the dead holder's lease at once, not after it expires
    _hold_then(tmp_path, signal.SIGKILL)
    assert _active_slots() == 1 and registry().leases()
    t0 = time.monotonic()
    ensure_gpu_limit()
    assert _active_slots() == 0 and time.monotonic() - t0 < 10 and not registry().leases()


def test_a_runs_own_server_is_known_by_its_database_not_its_port(monkeypatch, tmp_path):
    """A resumed run starts its own server again on another port: the killed attempt's GPU lease, recorded under
    the first port, must still be found as that database's (else its slot stays taken until the lease expires)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from tasks.gpu import OWN_SERVER_ENV, api_key
    first, second = "http://127.0.0.1:5001/api", "http://127.0.0.1:6002/api"
    with temporary_settings({PREFECT_API_URL: first, PREFECT_HOME: str(tmp_path)}):
        assert api_key() == first                                  # a shared server: its URL
        monkeypatch.setenv(OWN_SERVER_ENV, first)
        killed = api_key()
    with temporary_settings({PREFECT_API_URL: second, PREFECT_HOME: str(tmp_path)}):
        monkeypatch.setenv(OWN_SERVER_ENV, second)
        assert api_key() == killed == f"own:{tmp_path}"


# ---- one tree hash -------------------------------------------------------------------------------------------------
def test_workspace_store_and_evaluator_hash_a_workspace_alike(tmp_path):
    from seis.evaluator.snapshot import snapshot, tree_sha256
    from seis.workspace import Report, prepare_workspace, tree_hash

    ws = prepare_workspace(ENGINE_TEMPLATE, tmp_path / "ws", [Report("c0", 0, "# report\n", "retained")])
    assert (ws.root / "reports").is_dir()                             # session material beside the engine
    assert tree_sha256(ws.root) == tree_hash(ws.root) == tree_hash(ENGINE_TEMPLATE)
    judged = snapshot(ws.root, tmp_path / "judged")
    assert judged.sha256 == tree_hash(ws.root) and not (judged.path / "reports").exists()


def test_overlapping_runs_in_one_process_leave_tempfile_usable_and_remove_their_scratch(tmp_path):
    import tempfile

    from seis.session.resources import scratch

    before = tempfile.gettempdir()
    a, b = scratch(tmp_path / "run-a"), scratch(tmp_path / "run-b")
    root_a = a.__enter__()
    root_b = b.__enter__()
    made_in_b = Path(tempfile.mkdtemp())  # run a's thread, while b is the latest: its file lies in b's dir
    assert made_in_b.parent == root_b
    b.__exit__(None, None, None)  # b ends first: a is still working, and a's file in b's dir must survive
    assert made_in_b.is_dir() and tempfile.gettempdir() == str(root_a)
    a.__exit__(None, None, None)
    assert tempfile.gettempdir() == before and Path(before).is_dir()
    assert not root_a.exists() and not root_b.exists()
    with tempfile.TemporaryDirectory() as d:  # tempfile works after both (it pointed at a removed dir before)
        assert Path(d).is_dir()


# ---- a reference that fails beside the candidate -------------------------------------------------------------------
# The reference's build fails in its first process of a gate only: its cache directory (one per reference tree,
# kept across its processes) remembers. It stands for a reference that a candidate's company broke (on a GPU, a
# candidate that takes the device's memory makes the reference's allocations fail), and that builds alone.
FAILS_FIRST_BUILD = ("        from pathlib import Path as _Path\n"
                     "        if not _Path('/cache/built-once').exists():\n"
                     "            _Path('/cache/built-once').write_text('')\n"
                     "            raise RuntimeError('CUDA out of memory (stands for a neighbour that took the GPU)')\n"
                     "        opts, cfg = self.options, self.config\n")
FAILS_EVERY_BUILD = "        raise RuntimeError('the reference is broken')\n"


@pytest.fixture
def reference(tmp_path):
    """An E0 copy of its own (a nonce file makes its tree, and so its kept cache directory, unique to the test);
    `reference(build_prefix)` puts build_prefix at the start of its build. The cache is removed afterwards."""
    import uuid

    from evaluator_helpers import ENGINE_PY, copy_engine, edit
    from seis.engine_host.jit_cache import trusted_cache
    from seis.evaluator.snapshot import tree_sha256
    made = []

    def make(build_prefix: str) -> Path:
        root = copy_engine(tmp_path / "reference")
        (root / "nonce.txt").write_text(uuid.uuid4().hex)
        edit(root, ENGINE_PY, "        opts, cfg = self.options, self.config\n", build_prefix)
        made.append(trusted_cache(tree_sha256(root)))
        return root

    yield make
    for cache in made:
        shutil.rmtree(cache, ignore_errors=True)
        cache.with_name(cache.name + ".lock").unlink(missing_ok=True)


def test_a_reference_that_fails_beside_the_candidate_but_not_alone_fails_the_candidate(tmp_path, prepared_dir,
                                                                                      reference):
    """The gate replays the reference's calls with no engine beside it: they pass, so the failure was its
    company's doing, and the candidate fails (engine.reference_alone) instead of the run ending with no verdict."""
    from evaluator_helpers import copy_engine, tiny_config
    from seis.evaluator import run_gate
    result = run_gate(tiny_config(prepared_dir, copy_engine(tmp_path / "candidate"),
                                  reference=reference(FAILS_FIRST_BUILD)))
    assert result.verdict == "fail" and result.failed_checks == ["engine.reference_alone"], result.failed_checks
    [check] = [c for c in result.checks if c.name == "engine.reference_alone"]
    assert "failed in 'build'" in check.detail and "neighbour that took the GPU" in check.detail
    assert "the same 1 call(s) without failing" in check.detail and "reference_alone" in result.timings_s


def test_a_reference_that_fails_alone_too_leaves_the_gate_without_a_verdict(tmp_path, prepared_dir, reference):
    from evaluator_helpers import copy_engine, tiny_config
    from seis.evaluator import ReferenceFailure, run_gate
    with pytest.raises(ReferenceFailure, match="the reference is broken"):
        run_gate(tiny_config(prepared_dir, copy_engine(tmp_path / "candidate"),
                             reference=reference(FAILS_EVERY_BUILD)))
