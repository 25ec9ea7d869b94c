"""Resume: an interrupted run continues from its recorded config; finished sessions are not redone, unfinished ones
are redone from their parents, fan-ins are recomputed, and the summary comes out as if nothing had happened.

Three ways to interrupt: a gate that reaches no verdict (an injected host failure, in-process), the run's process
killed outright mid-session (`seis evolve` in a subprocess, SIGKILL, then `seis evolve --resume`), and Ctrl-C
(SIGINT to the run's process group, as a terminal sends it), which must stop the run at once and leave nothing
running."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

import flows  # noqa: F401  (SEIS's Prefect settings, before the test server starts)

from seis.run_config import RunConfig
from seis.session.resources import run_scratch_path

LIBRARY = Path(__file__).resolve().parents[1] / "seis" / "agents" / "offline" / "library"


def _library(tmp_path: Path) -> Path:
    import shutil
    lib = tmp_path / "library"
    for name in ("batched-scoring", "decode-pinned-metadata"):
        shutil.copytree(LIBRARY / name, lib / name)
    return lib


class _Counting:
    """Counts the real agent edits and gate runs per (chain, session), and fails the gates named in `fail`."""

    def __init__(self, monkeypatch, fail: set[tuple[str, int]] = frozenset()):
        import seis.session.steps as steps
        import tasks.session as session_tasks
        self.agents, self.gates, self.fail, self.lock = Counter(), Counter(), set(fail), threading.Lock()
        real_agent, real_gate = session_tasks.run_agent, steps.gate_workspace

        def run_agent(config, spec, workspace):
            with self.lock:
                self.agents[(spec.chain, spec.session)] += 1
            return real_agent(config, spec, workspace)

        def gate_workspace(config, spec, workspace, parent_dir):
            if (spec.chain, spec.session) in self.fail:
                from seis.evaluator import HostFailure
                raise HostFailure("the candidate engine was killed by the host during 'build' (SIGKILL, no error "
                                  "of its own; most likely the kernel's OOM killer): no verdict")
            result = real_gate(config, spec, workspace, parent_dir)
            with self.lock:
                self.gates[(spec.chain, spec.session)] += 1
            return result

        monkeypatch.setattr(session_tasks, "run_agent", run_agent)
        monkeypatch.setattr(steps, "gate_workspace", gate_workspace)


@pytest.mark.slow
def test_resume_after_a_host_failure_redoes_only_the_unfinished_session(harness, tmp_path, prepared_dir,
                                                                          monkeypatch):
    from flows.seis_flow import seis
    config = RunConfig(protocol="sync-chain", chains=2, sessions=2, sync_every=1, model="tiny-qwen3", device="cpu",
                       gate="smoke", out=tmp_path / "run", store=tmp_path / "store", agent_library=_library(tmp_path))
    run = tmp_path / "run"

    # attempt 1: c1's first gate is OOM-killed: no verdict, so no rejection; c0's first session finishes
    counts = _Counting(monkeypatch, fail={("c1", 0)})
    state = seis(config, return_state=True)
    assert state.is_failed() and "c1/s0: host failure" in state.message and "resume=" in state.message
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and "host failure" in status["message"] and "--resume" in status["note"]
    assert status["sessions_done"] == 1                                        # c0's first session is recorded
    assert (run / "chains" / "c0" / "000" / "outcome.json").is_file()
    assert not (run / "chains" / "c1" / "000" / "outcome.json").exists()      # not recorded as a rejection
    assert not (run / "summary.parquet").exists() and not (run / "chains" / "c0" / "001").exists()
    first_c0 = (run / "chains" / "c0" / "000" / "outcome.json").stat().st_mtime_ns
    assert not run_scratch_path(run).exists()

    # the same output dir without resume is refused, naming the resume parameter
    refused = seis(config, return_state=True)
    assert refused.is_failed() and f"resume={run}" in refused.message

    # attempt 2: resume from the recorded config (the other parameters are not needed)
    monkeypatch.undo()
    counts2 = _Counting(monkeypatch)
    resumed = seis(resume=str(run), return_state=True)
    assert resumed.is_completed(), resumed.message
    done = Counter(counts.agents) + Counter(counts2.agents)
    gated = Counter(counts.gates) + Counter(counts2.gates)
    sessions = {(c, s) for c in ("c0", "c1") for s in (0, 1)}
    # every session was gated exactly once; only the unfinished one was edited again (redone from its parent)
    assert set(gated) == sessions and set(gated.values()) == {1}
    assert done == {**{s: 1 for s in sessions}, ("c1", 0): 2}
    assert ("c0", 0) not in counts2.agents                                    # finished: not redone
    assert (run / "chains" / "c0" / "000" / "outcome.json").stat().st_mtime_ns == first_c0

    df = pd.read_parquet(run / "summary.parquet")
    assert len(df) == 4 and df.retained.all()
    s0, s1 = df[df.session == 0].set_index("chain"), df[df.session == 1].set_index("chain")
    for chain, peer in (("c0", "c1"), ("c1", "c0")):   # the fan-in recomputed from the recorded state
        assert s1.loc[chain, "parent_snapshot"] == s0.loc[chain, "snapshot"]
        assert s1.loc[chain, "synced_from"] == peer and s1.loc[chain, "adopted"] == s0.loc[peer, "applied"]
    assert (run / "figures" / "chain_speedups.png").is_file() and json.loads((run / "best.json").read_text())
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "complete" and status["resumes"] == 1 and status["sessions_done"] == 4
    assert not run_scratch_path(run).exists()


def test_flow_parameters_override_one_at_a_time_with_the_same_validation(harness, tmp_path):
    from flows.seis_flow import seis
    from seis.session.params import ParameterError, resolve_config
    import inspect

    # every RunConfig field is a flow parameter of its own, beside `config` and `resume`
    assert set(inspect.signature(seis.fn).parameters) == set(RunConfig.model_fields) | {"config", "resume"}
    deployment = {"protocol": "sync-chain", "chains": 3, "sessions": 6, "sync_every": 3, "gate": "full"}
    merged = resolve_config(None, {**deployment, "chains": 2}).config     # one override keeps the rest
    assert (merged.chains, merged.sessions, merged.sync_every, merged.gate) == (2, 6, 3, "full")
    merged = resolve_config(deployment, {"chains": 2}).config              # the same over a whole `config`
    assert (merged.chains, merged.sessions, merged.gate) == (2, 6, "full")
    with pytest.raises(ParameterError, match="chains"):
        resolve_config(None, {**deployment, "chains": 0})
    with pytest.raises(ParameterError, match=r"sync_every \(3\) must not exceed sessions \(2\)"):
        resolve_config(None, {**deployment, "sessions": 2})
    # through Prefect: a bad value is refused before any work, with RunConfig's message
    state = seis(chains=0, out=str(tmp_path / "run"), store=str(tmp_path / "store"), return_state=True)
    assert state.is_failed() and "chains" in state.message and "greater than or equal to 1" in state.message
    assert not (tmp_path / "run").exists()


def _evolve(*args: str, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_URL")}
    return subprocess.Popen([sys.executable, "-m", "seis.cli", "evolve", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)


def _sigint_default() -> None:  # a CI job may run the tests with SIGINT ignored, which children inherit
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _processes_of(run: Path) -> list[int]:
    """Live processes whose command line or environment names the run directory (its Prefect server, engines)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if str(run).encode() in text:
            found.append(int(entry.name))
    return found


def _engines_under(pid: int) -> list[int]:
    """Processes under `pid`, at any depth, that run the engine host's worker: a gate's engine sandboxes (their
    launchers, their init and the worker itself)."""
    parents, engine = {}, set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if b"/seis-host/worker.py" in (entry / "cmdline").read_bytes():
                engine.add(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue

    def under(p: int) -> bool:
        for _ in range(64):
            p = parents.get(p, 0)
            if p == pid:
                return True
            if p <= 1:
                return False
        return False
    return [p for p in engine if under(p)]


def _hold_the_gate(proc: subprocess.Popen, session_dir: Path, timeout_s: float = 240) -> None:
    """Until the session's agent has finished and its gate's engines run, then stop them (SIGSTOP): the gate
    cannot end before whatever the caller does next, however late this machine lets it come."""
    outcome, deadline = session_dir / "outcome.json", time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stdout.read()
        assert not outcome.exists(), "the gate ended before its engines were seen"
        if (session_dir / "agent.json").is_file() and (engines := _engines_under(proc.pid)):
            for pid in engines:
                os.kill(pid, signal.SIGSTOP)
            assert not outcome.exists(), "the gate ended before its engines were stopped"
            return
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_a_killed_run_resumes_with_every_session_exactly_once(tmp_path, prepared_dir):
    """The run's process is killed (SIGKILL) while session 1's gate holds the GPU slot; --resume finishes it."""
    run = tmp_path / "run"
    proc = _evolve("--protocol", "chain", "--chains", "1", "--sessions", "2", "--model", "tiny-qwen3", "--device",
                   "cpu", "--gate", "smoke", "--out", str(run), "--store", str(tmp_path / "store"))
    s1 = run / "chains" / "c0" / "001"
    _hold_the_gate(proc, s1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "running" and status["note"]                   # half-finished, and says so
    first = (run / "chains" / "c0" / "000" / "outcome.json").read_text()
    agent0 = (run / "chains" / "c0" / "000" / "agent.json").stat().st_mtime_ns
    assert not (s1 / "outcome.json").exists()

    resumed = _evolve("--resume", str(run))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert (run / "chains" / "c0" / "000" / "outcome.json").read_text() == first     # not redone
    assert (run / "chains" / "c0" / "000" / "agent.json").stat().st_mtime_ns == agent0
    assert "c0/s0 agent-edit" not in out and "c0/s1 agent-edit" in out
    df = pd.read_parquet(run / "summary.parquet")
    assert list(df.session) == [0, 1] and df.loc[1, "parent_snapshot"] == df.loc[0, "snapshot"]
    assert json.loads((run / "status.json").read_text())["state"] == "complete"
    # the killed attempt's GPU slot was released at once, not left to its lease (LEASE_S after its last renewal):
    # a wait of a few seconds is one refused attempt and the server's Retry-After on a loaded machine (5.8 s seen)
    from tasks.gpu import LEASE_S
    waited = [float(line.split("after waiting ")[1].split(" s")[0]) for line in out.splitlines()
              if "GPU slot acquired after waiting" in line]
    assert waited and max(waited) < LEASE_S / 4, out
    assert not run_scratch_path(run).exists()


def _output_or_stacks(proc: subprocess.Popen, timeout_s: float) -> str:
    """The run's output once it ends; a run still there after timeout_s fails the test with every thread's stack
    (`seis evolve` prints them on SIGUSR1), then is killed."""
    try:
        return proc.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        pytest.fail(f"the run was still there {timeout_s:g} s after the signal; its threads then:\n{out[-12000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_run_at_once_and_leaves_nothing_running(how, tmp_path, prepared_dir):
    """SIGINT to the run's process group (Ctrl-C in a terminal), or SIGTERM to its process (a supervisor), while a
    smoke gate holds the GPU slot (its engines held stopped, as in the killed run above): the run ends within
    seconds with exit code 130 and the resume command, its engines and Prefect server are gone, the interrupted
    session left no outcome, and --resume then finishes the run (checked after the Ctrl-C)."""
    run = tmp_path / "run"
    proc = _evolve("--protocol", "chain", "--chains", "1", "--sessions", "1", "--model", "tiny-qwen3", "--device",
                   "cpu", "--gate", "smoke", "--out", str(run), "--store", str(tmp_path / "store"),
                   preexec_fn=_sigint_default)
    s0 = run / "chains" / "c0" / "000"
    _hold_the_gate(proc, s0)
    assert _processes_of(run), "the run's processes should be visible while it runs"
    t0 = time.monotonic()
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    out = _output_or_stacks(proc, timeout_s=120)
    stopped_s = time.monotonic() - t0
    assert proc.returncode == 130, out
    assert f"seis evolve --resume {run}" in out
    assert stopped_s < 20, f"took {stopped_s:.1f} s to stop:\n{out[-3000:]}"
    deadline = time.monotonic() + 15  # the server's SIGTERM shutdown may take a moment
    while (left := _processes_of(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running after the run ended: {left}"
    assert not (s0 / "outcome.json").exists()   # no verdict for the gate that was cut short
    assert json.loads((run / "status.json").read_text())["state"] == "crashed"
    if how == "sigterm":  # the resume after either is the same: its gate is run once
        return

    resumed = _evolve("--resume", str(run))
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert json.loads((run / "status.json").read_text())["state"] == "complete"
    assert list(pd.read_parquet(run / "summary.parquet").session) == [0]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_while_the_prefect_server_starts_says_so_and_leaves_nothing_running(how, tmp_path):
    """The run's own Prefect server takes seconds to start, before the flow records the run. Ctrl-C or SIGTERM
    then ends `seis evolve` with exit code 130 and one line that says the run never started (there is nothing to
    resume), no server is left running, and the same command is accepted again."""
    run = tmp_path / "run"
    args = ("--protocol", "chain", "--chains", "1", "--sessions", "1", "--model", "tiny-qwen3", "--device", "cpu",
            "--gate", "smoke", "--out", str(run), "--store", str(tmp_path / "store"))
    proc = _evolve(*args, preexec_fn=_sigint_default)
    deadline = time.monotonic() + 60
    while not (run / ".prefect" / "server.log").exists():  # the server is being started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.02)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    out = _output_or_stacks(proc, timeout_s=60)
    assert proc.returncode == 130, out
    assert "interrupted before the run started" in out and "Traceback" not in out, out
    assert not (run / "config.json").exists()
    deadline = time.monotonic() + 15
    while (left := _processes_of(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running after the run ended: {left}"
    RunConfig(protocol="chain", chains=1, sessions=1, model="tiny-qwen3", device="cpu", gate="smoke", out=run,
              store=tmp_path / "store").preflight()   # the same command is not refused for a used output dir


def test_evolve_prints_every_threads_stack_on_sigusr1_and_goes_on():
    """What the stuck-run diagnosis above relies on: after `seis evolve`'s set-up, SIGUSR1 prints the stack of
    every thread (a waiting one included) to stderr, and the process carries on."""
    code = (
        "import os, signal, threading, time\n"
        "from seis.cli import _stacks_on_sigusr1\n"
        "_stacks_on_sigusr1()\n"
        "def parked_helper_thread(): time.sleep(30)\n"
        "threading.Thread(target=parked_helper_thread, daemon=True).start()\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "print('carried on')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "carried on", done.stderr
    assert "parked_helper_thread" in done.stderr and "most recent call first" in done.stderr, done.stderr


def test_a_verdict_that_comes_back_after_an_interrupt_is_not_recorded(harness, tmp_path, monkeypatch):
    """Ctrl-C lands after the gate's engines are gone but before its verdict is recorded: the session task starts no
    further step (no snapshot, no outcome, no report), so a resumed run redoes the session rather than keep a
    session that the run was told to stop. In-process, with a fake agent and a gate that passes, then interrupts."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from prefect import flow

    import seis.sandbox.process as process
    import tasks.session as ts
    from seis.agents import AgentResult
    from seis.session.judge import Judgement
    from seis.store import SnapshotStore
    from session_fakes import first_session
    from tasks.cancelled import RunCancelled

    monkeypatch.setattr(process, "_INTERRUPTED", threading.Event())  # this test's interrupt, not the process's

    def fake_agent(config, spec, workspace):
        (workspace.root / "engine" / "note.txt").write_text("an edit\n")
        return AgentResult("fake", "edited", "# an edit\n", applied=("edit",))

    def gate_then_ctrl_c(config, spec, workspace, parent_dir):
        process.interrupt()   # what the signal handler does; the verdict below was reached before it
        return Judgement(SimpleNamespace(verdict="pass", speed=None, failed_checks=()), ())

    monkeypatch.setattr(ts, "run_agent", fake_agent)
    monkeypatch.setattr(ts, "judge", gate_then_ctrl_c)
    monkeypatch.setattr(ts, "gpu_slot", lambda *a, **k: nullcontext())
    store = SnapshotStore(tmp_path / "store")
    config, spec = first_session(tmp_path, store)

    @flow
    def one_session():
        return ts.session_task(config, spec, store.root)

    with pytest.raises(RunCancelled, match="interrupted"):
        one_session()
    assert not (spec.session_dir / "outcome.json").exists() and not (spec.session_dir / "report.md").exists()
    assert [s.id for s in store.list()] == [spec.parent_snapshot]   # nothing of the unrecorded session was stored


def test_paths_given_relative_are_recorded_absolute_so_a_resume_from_elsewhere_uses_the_same(tmp_path,
                                                                                            monkeypatch):
    """agent_library, base_engine, a local model directory and a prompt template file, given relative to the working directory, are
    recorded absolute (as out and store are): resumed from another directory, the recorded config named whatever
    lay at those relative paths there (another library, engine or model), or nothing."""
    from seis.models import resolve_model
    from seis.session.params import resolve_config
    from seis.session.rundir import RunDir

    for name in ("first", "second"):
        (tmp_path / name / "lib").mkdir(parents=True)
        (tmp_path / name / "engine").mkdir()
    import shutil
    shutil.copytree(resolve_model("tiny-qwen3"), tmp_path / "first" / "model")
    monkeypatch.chdir(tmp_path / "first")
    (tmp_path / "first" / "mine.md").write_text("a template\n")
    config = RunConfig(agent_library="lib", base_engine="engine", model="model", out="run", store="store",
                       prompt_template="mine.md")
    first = tmp_path / "first"
    assert (config.agent_library, config.base_engine, config.model) == (first / "lib", first / "engine",
                                                                          str(first / "model"))
    assert config.prompt_template == str(first / "mine.md")
    assert RunConfig(model="tiny-qwen3").model == "tiny-qwen3"   # a model name stays a name
    assert RunConfig(prompt_template="session_v1").prompt_template == "session_v1"  # and a bundled template's
    RunDir.create(config.out, config.model_dump_json(indent=2))
    monkeypatch.chdir(tmp_path / "second")
    resumed = resolve_config(None, {}, first / "run").config
    assert (resumed.agent_library, resumed.base_engine, resumed.model, resumed.prompt_template) == (
        config.agent_library, config.base_engine, config.model, config.prompt_template)


def _recorded_chain_run(tmp_path: Path) -> tuple[RunConfig, Path]:
    """A chain run as an interrupted attempt leaves it: vanilla pinned, c0/s0 finished and retained (its engine in
    the store), c0/s1 not recorded."""
    import shutil

    from seis.engine_import import ENGINE_TEMPLATE
    from seis.session import RunDir, SessionOutcome
    from seis.session.resume import save_outcome
    from seis.store import SnapshotStore
    from seis.workspace import Report

    config = RunConfig(protocol="chain", chains=1, sessions=2, model="tiny-qwen3", device="cpu", gate="smoke",
                       out=tmp_path / "run", store=tmp_path / "store")
    run = RunDir.create(config.out, config.model_dump_json(indent=2))
    run.set_status("crashed", flow_run_id="fr-1", sessions_total=2)
    store = SnapshotStore(config.store)
    vanilla = store.put(ENGINE_TEMPLATE, {"role": "vanilla"})
    run.record_vanilla(vanilla)
    edited = tmp_path / "edited"
    shutil.copytree(ENGINE_TEMPLATE, edited)
    (edited / "engine" / "tuned.py").write_text("FAST = True\n")
    retained = store.put(edited, {"run": config.run_id, "chain": "c0", "session": 0})
    session_dir = run.session_dir("c0", 0)
    session_dir.mkdir(parents=True)
    (session_dir / "gate.json").write_text('{"verdict": "pass"}\n')
    (session_dir / "report.md").write_text("an agent's paid-for report\n")
    save_outcome(session_dir, SessionOutcome(
        chain="c0", session=0, parent_snapshot=vanilla, snapshot=retained, retained=True, verdict="pass",
        reasons=(), dev_speedup_vs_vanilla=1.3, dev_speedup_vs_parent=1.3, synced_from=(), agent="anthropic",
        applied=("tuned",), adopted=(), tokens_in=90_000, tokens_out=9_000, cost_usd=4.2, wall_s=600.0,
        report=Report("c0", 0, "an agent's paid-for report\n", "retained")))
    return config, session_dir


@pytest.mark.parametrize("store_is", ["gone", "empty"])
def test_a_resume_whose_store_lost_the_runs_snapshots_is_refused_and_deletes_nothing(tmp_path, monkeypatch,
                                                                                     store_is):
    """The recorded store is gone (moved, a mount that is not up) or empty: a resume judged the finished sessions
    whose engines it lacks unfinished, deleted their gate, report and workspace, pinned a new vanilla and ran them
    again (an LLM agent's paid-for work lost), exiting 0. It is refused in one line naming the store and the
    missing snapshots, before any work, and the run directory stays as it was."""
    from typer.testing import CliRunner

    import seis.cli
    from seis.session.preflight import preflight_run

    config, session_dir = _recorded_chain_run(tmp_path)
    before = {p.name: p.read_bytes() for p in session_dir.iterdir()}
    vanilla_json = (config.out / "vanilla.json").read_bytes()
    (tmp_path / "store").rename(tmp_path / "store.moved")
    if store_is == "empty":
        (tmp_path / "store").mkdir()

    def started(out):
        raise AssertionError("the run started")
    monkeypatch.setattr(seis.cli, "_prefect_api", started)
    out = CliRunner().invoke(seis.cli.app, ["evolve", "--resume", str(config.out)])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: the store {config.store} "), out.stderr
    outcome = json.loads((session_dir / "outcome.json").read_text())
    assert outcome["snapshot"] in lines[0] and "c0/s0" in lines[0] and outcome["parent_snapshot"] in lines[0]
    assert {p.name: p.read_bytes() for p in session_dir.iterdir()} == before
    assert (config.out / "vanilla.json").read_bytes() == vanilla_json
    assert (tmp_path / "store").exists() == (store_is == "empty")   # a missing store is not made empty either

    # the store back in place: the same resume passes its checks
    (tmp_path / "store").rmdir() if store_is == "empty" else None
    (tmp_path / "store.moved").rename(tmp_path / "store")
    assert preflight_run(config, resume=True) is not None
