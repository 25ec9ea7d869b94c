"""How a run ends and what it says while it runs: a run in which nothing was judged fails (with one line, a non-zero
exit and status.json `failed`); device cuda without a GPU is refused before any work; every session line carries
its speedups (and whether they are within noise) and the best so far; sessions_done counts as sessions finish;
the best-engine pick ranks a gain within noise as 1.0x."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from seis.evaluator.schema import SpeedRow, SpeedStat, SpeedTable, SpeedWorkloadInfo
from seis.run_config import RunConfig
from seis.session import RunDir, pick_best
from seis.session.progress import (GainNoise, dev_speedups, gain_noise, pick_best_of_run, progress_line,
                                   run_failure, session_gain_noise, session_line, within_noise)
from seis.session.resume import save_outcome
from seis.session.spec import SessionOutcome
from seis.workspace import Report



def outcome(chain: str, session: int, verdict: str, vs_vanilla: float | None = None, vs_parent: float | None = None,
            parent: str = "e0", snapshot: str | None = None, reasons: tuple[str, ...] = ()) -> SessionOutcome:
    retained = verdict == "pass"
    return SessionOutcome(
        chain=chain, session=session, parent_snapshot=parent, snapshot=(snapshot or f"{chain}{session}") if retained
        else parent, retained=retained, verdict=verdict, reasons=reasons, dev_speedup_vs_vanilla=vs_vanilla,
        dev_speedup_vs_parent=vs_parent, synced_from=(), agent="offline", applied=(), adopted=(), tokens_in=0,
        tokens_out=0, cost_usd=0.0, wall_s=1.0, report=Report(chain, session, "report"))


# ---- (a) the failure decision ------------------------------------------------------------------------------------
def test_a_run_whose_sessions_all_errored_fails_with_one_line_naming_the_first_reason():
    errored = [outcome("c0", 0, "error", reasons=("agent: failed",)),
               outcome("c1", 0, "error", reasons=("gate refused the workspace: engine/\nmissing",))]
    line = run_failure(errored)
    assert line is not None and "\n" not in line
    assert line.startswith("every session errored (2 of 2)") and "c0/s0: agent: failed" in line


def test_one_verdict_pass_or_fail_means_the_run_completes():
    assert run_failure([outcome("c0", 0, "error", reasons=("agent: failed",)), outcome("c1", 0, "pass", 1.2, 1.2)]) \
        is None
    assert run_failure([outcome("c0", 0, "fail", reasons=("dev.greedy",)), outcome("c0", 1, "error")]) is None


def test_no_change_alone_completes_but_beside_errors_fails():
    # an agent with nothing left to try (an exhausted offline library) is an answer, not a fault: the run completes
    assert run_failure([outcome("c0", 0, "no_change", reasons=("agent: no_change",))] * 2) is None
    # errors and nothing else judged: the run did nothing and something broke
    line = run_failure([outcome("c0", 0, "error", reasons=("agent: failed",)),
                        outcome("c0", 1, "no_change", reasons=("agent: no_change",))])
    assert line is not None and line.startswith("no session reached a verdict: 1 of 2 errored")
    assert run_failure([]) is None


# ---- (b) device cuda without CUDA ----------------------------------------------------------------------------------
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA GPU")
def test_device_cuda_without_a_gpu_is_refused_before_any_work(tmp_path):
    from seis.session.preflight import preflight_run
    config = RunConfig(model="tiny-qwen3", device="cuda", gate="smoke", out=tmp_path / "run",
                       store=tmp_path / "store")
    with pytest.raises(ValueError, match="device cuda was asked for, but this machine has no usable CUDA GPU"):
        preflight_run(config)
    assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()
    # with dispatch=workers the device is the workers': not this machine's to check
    RunConfig(model="tiny-qwen3", device="cuda", gate="smoke", out=tmp_path / "w", dispatch="workers")._check_device()
    # the command line: exit 2, the reason on one line, nothing written
    out = subprocess.run([sys.executable, "-m", "seis.cli", "evolve", "--device", "cuda", "--out",
                          str(tmp_path / "run"), "--store", str(tmp_path / "store")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no usable CUDA GPU" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()


# ---- (c) noise and the best pick -----------------------------------------------------------------------------------
def stat(*values: float) -> SpeedStat:
    return SpeedStat(median=sorted(values)[len(values) // 2], min=min(values), max=max(values), n=len(values),
                     values=list(values))


def speed(candidate: SpeedStat, parent: SpeedStat, vanilla: SpeedStat) -> SpeedTable:
    """A gate's speed table: the natural single-request workload holds the given stats; the others are decoys
    that overlap everywhere (the rule must read the natural one)."""
    infos = [SpeedWorkloadInfo(name=n, n_prompts=1, max_new_tokens=8, ignore_eos=n == "dev-fixed256",
                               workload_digest="d", batch=b)
             for n, b in (("dev-natural@8", 1), ("dev-fixed256", 1), ("dev-natural@8-batch2", 2))]
    rows = []
    for name, wide in (("dev-natural@8", False), ("dev-fixed256", True), ("dev-natural@8-batch2", True)):
        for engine, s in (("candidate", candidate), ("parent", parent), ("vanilla", vanilla)):
            rows.append(SpeedRow(workload=name, engine=engine, tokens_per_pass=8.0,
                                 tok_per_s=stat(1.0, 500.0) if wide else s, latency_ms=None))
    return SpeedTable(device="cpu", reps=3, method="m", workloads=infos, rows=rows)


def test_a_speedup_is_within_noise_when_the_tok_per_s_ranges_overlap():
    assert within_noise(stat(104, 110, 120), stat(90, 100, 105))          # 1.10x by medians, ranges touch
    assert not within_noise(stat(150, 155, 160), stat(90, 100, 105))      # the slowest pass beats the fastest
    assert within_noise(stat(100, 100, 100), stat(100, 100, 100))
    assert not within_noise(None, stat(1, 2, 3)) and not within_noise(stat(1, 2, 3), None)
    # the natural single-request workload decides, not the batched or fixed-length ones
    noise = gain_noise(speed(candidate=stat(150, 155, 160), parent=stat(140, 150, 152), vanilla=stat(90, 100, 105)))
    assert noise == GainNoise(vs_parent=True, vs_vanilla=False)
    assert gain_noise(None) == GainNoise()


def test_the_session_line_shows_speedups_noise_and_the_best_so_far():
    o = outcome("c1", 2, "pass", 1.52, 1.04, snapshot="2f07be636240d250")
    line = session_line(o, "applied=['x']", GainNoise(vs_parent=True), best=o)
    assert line == ("[c1 s2] applied=['x'] -> pass, retained (2f07be636240d250); vs parent 1.04x (within noise), "
                    "vs vanilla 1.52x; best so far 1.52x (c1/s2)")
    rejected = outcome("c0", 0, "error", reasons=("agent: failed",))
    assert session_line(rejected, "n", best=None).endswith(
        "-> error, kept parent (e0); vs parent -, vs vanilla -; best so far none retained")


def test_the_best_pick_ranks_a_gain_within_noise_as_one():
    # the smoke gate on a busy CPU: 1.47x whose tok/s range overlaps vanilla's, beside a clear 1.10x
    noisy = outcome("c0", 0, "pass", 1.47, 1.47, snapshot="lucky")
    clear = outcome("c1", 0, "pass", 1.10, 1.10, snapshot="real")
    assert pick_best([noisy, clear]) is noisy                       # ratios alone: the noise wins
    assert pick_best([noisy, clear], noisy={("c0", 0)}) is clear   # ranked as 1.0x, it does not
    # nothing showed a gain: one ranked 1.0x over a clear slowdown; among those, the ratio breaks the tie
    slower = outcome("c2", 0, "pass", 0.8, 0.8, snapshot="slow")
    assert pick_best([slower, noisy], noisy={("c0", 0)}) is noisy
    also_noisy = outcome("c3", 0, "pass", 1.02, 1.02, snapshot="meh")
    assert pick_best([also_noisy, noisy, slower], noisy={("c0", 0), ("c3", 0)}) is noisy
    # a child that matched its parent in one gate still leaves its parent out, noise or not
    child = outcome("c0", 1, "pass", 1.50, 1.01, parent="lucky", snapshot="lucky+")
    assert pick_best([noisy, child, clear], noisy={("c0", 0)}) is child


def test_the_runs_best_reads_the_noise_from_each_sessions_gate(tmp_path):
    run = RunDir.create(tmp_path / "run", "{}")
    sessions = {("c0", 0): (outcome("c0", 0, "pass", 1.47, 1.47, snapshot="lucky"),
                            speed(stat(80, 140, 150), stat(70, 95, 110), stat(70, 95, 110))),
                ("c1", 0): (outcome("c1", 0, "pass", 1.10, 1.10, snapshot="real"),
                            speed(stat(120, 121, 122), stat(100, 110, 111), stat(100, 110, 111)))}
    for (chain, s), (o, table) in sessions.items():
        d = run.session_dir(chain, s)
        d.mkdir(parents=True)
        (d / "gate.json").write_text(json.dumps({"verdict": "pass", "speed": table.model_dump(mode="json")}))
        save_outcome(d, o)
    # a session that took c1/s0's verdict reads that session's gate
    reused = run.session_dir("c2", 0)
    reused.mkdir(parents=True)
    (reused / "gate-reused.json").write_text(json.dumps({"session": "chains/c1/000", "key": "k"}))
    assert session_gain_noise(reused) == GainNoise(False, False)
    # a record with its own speed table reads it, whatever the gated session's directory holds since: a resume
    # that kept this session may have redone and cleared that one
    recorded = run.session_dir("c3", 0)
    recorded.mkdir(parents=True)
    (recorded / "gate-reused.json").write_text(json.dumps(
        {"session": "chains/c1/000", "key": "k", "speed": sessions[("c0", 0)][1].model_dump(mode="json")}))
    assert session_gain_noise(recorded) == GainNoise(True, True)
    assert session_gain_noise(run.session_dir("c0", 0)) == GainNoise(True, True)
    outcomes = [o for o, _ in sessions.values()]
    best, best_noisy = pick_best_of_run(run.root, outcomes)
    assert best is outcomes[1] and not best_noisy
    line = progress_line(run.session_dir("c0", 0), "notes", outcomes[0])
    assert "vs vanilla 1.47x (within noise)" in line and line.endswith("best so far 1.10x (c1/s0)")


def two_workloads(single: tuple[SpeedStat, float], batched: tuple[SpeedStat, float],
                  vanilla: tuple[SpeedStat, SpeedStat]) -> SpeedTable:
    """A gate's speed table with one one-at-a-time and one batched workload: the candidate's tok/s and ratio over
    vanilla on each (over its parent alike), and vanilla's tok/s (the parent's alike)."""
    infos = [SpeedWorkloadInfo(name=n, n_prompts=1, max_new_tokens=8, ignore_eos=False, workload_digest="d",
                               batch=b) for n, b in (("dev-natural@8", 1), ("dev-natural@8-batch4", 4))]
    rows = []
    for name, (cand, ratio), base in (("dev-natural@8", single, vanilla[0]),
                                      ("dev-natural@8-batch4", batched, vanilla[1])):
        rows.append(SpeedRow(workload=name, engine="candidate", tokens_per_pass=8.0, tok_per_s=cand,
                             latency_ms=None, vs_parent=ratio, vs_vanilla=ratio))
        rows += [SpeedRow(workload=name, engine=e, tokens_per_pass=8.0, tok_per_s=base, latency_ms=None)
                 for e in ("parent", "vanilla")]
    return SpeedTable(device="cuda", reps=3, method="m", workloads=infos, rows=rows)


def test_the_best_pick_ranks_engines_on_the_runs_objective(tmp_path):
    """A throughput run's best engine is the one fastest with many requests in flight, not the fastest one at a
    time; "both" ranks on the geometric mean of the two."""
    vanilla = (stat(99, 100, 101), stat(990, 1000, 1010))
    latency_engine = two_workloads((stat(249, 250, 251), 2.5), (stat(899, 900, 901), 0.9), vanilla)
    server_engine = two_workloads((stat(179, 180, 181), 1.8), (stat(1499, 1500, 1501), 1.5), vanilla)
    assert dev_speedups(latency_engine, "single") == dev_speedups(latency_engine, "none") == (2.5, 2.5)
    assert dev_speedups(latency_engine, "throughput") == (0.9, 0.9)
    assert dev_speedups(latency_engine, "both")[0] == pytest.approx((2.5 * 0.9) ** 0.5)
    assert dev_speedups(None, "both") == (None, None)
    # within noise only where it is so on every ranked workload
    even_batched = two_workloads((stat(249, 250, 251), 2.5), (stat(995, 1000, 1005), 1.0), vanilla)
    assert gain_noise(even_batched, "throughput") == GainNoise(True, True)
    assert gain_noise(even_batched, "both") == gain_noise(even_batched, "single") == GainNoise(False, False)
    # a table whose gate timed no batched workload: the one-at-a-time one ranks, whatever the objective
    single_only = latency_engine.model_copy(update={
        "workloads": latency_engine.workloads[:1],
        "rows": [r for r in latency_engine.rows if r.workload == "dev-natural@8"]})
    assert dev_speedups(single_only, "throughput") == (2.5, 2.5)

    run = RunDir.create(tmp_path / "run", "{}")
    tables = {"latency": latency_engine, "server": server_engine}
    for objective, expected in (("single", "latency"), ("throughput", "server"), ("both", "server")):
        outcomes = []
        for i, (snapshot, table) in enumerate(tables.items()):
            d = run.session_dir(f"{objective}{i}", 0)
            d.mkdir(parents=True)
            (d / "gate.json").write_text(json.dumps({"verdict": "pass", "speed": table.model_dump(mode="json")}))
            vs_vanilla, vs_parent = dev_speedups(table, objective)
            outcomes.append(outcome(f"{objective}{i}", 0, "pass", vs_vanilla, vs_parent, snapshot=snapshot))
        best, within = pick_best_of_run(run.root, outcomes, objective)
        assert (best.snapshot, within) == (expected, False), objective


# ---- (d) sessions_done as sessions finish --------------------------------------------------------------------------
def test_sessions_done_counts_each_recorded_session_even_when_two_finish_at_once(tmp_path):
    run = RunDir.create(tmp_path / "run", "{}")
    run.set_status("running", flow_run_id="fr-1", sessions_total=4)
    pid, state = run.status().pid, run.status().state
    go = threading.Barrier(2)
    errors = []

    def finish(chain: str, session: int) -> None:
        try:
            d = run.session_dir(chain, session)
            d.mkdir(parents=True)
            go.wait()
            save_outcome(d, outcome(chain, session, "pass", 1.1, 1.1))
        except Exception as e:  # pragma: no cover - surfaced below
            errors.append(e)

    for s in (0, 1):
        threads = [threading.Thread(target=finish, args=(c, s)) for c in ("c0", "c1")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        status = run.status()
        assert status.sessions_done == 2 * (s + 1), status
        assert (status.state, status.pid, status.sessions_total) == (state, pid, 4)
    # a session dir outside a run directory (no status.json above it) writes no status
    lone = tmp_path / "x" / "chains" / "c0" / "000"
    lone.mkdir(parents=True)
    save_outcome(lone, outcome("c0", 0, "pass", 1.0, 1.0))
    assert not (tmp_path / "x" / "status.json").exists() and not (tmp_path / "x" / ".status.lock").exists()


# ---- (e) end to end: `seis evolve` whose every session errors ------------------------------------------------------
def _library_that_never_applies(tmp_path: Path) -> Path:
    """One transformation whose patch does not apply to E0: the offline agent fails, no gate runs (verdict
    error): the cheapest session that errors."""
    d = tmp_path / "library" / "never-applies"
    d.mkdir(parents=True)
    (d / "patch.diff").write_text("--- a/engine/model.py\n+++ b/engine/model.py\n@@ -1,3 +1,3 @@\n"
                                  " this line is not in E0\n-nor this one\n+but this would be\n and not this\n")
    (d / "meta.yaml").write_text("name: never-applies\nrationale: a patch against another tree\n"
                                 "expected_effect: none\ntarget_files: [engine/model.py]\n")
    return tmp_path / "library"


@pytest.mark.slow
def test_evolve_whose_every_session_errors_exits_non_zero_and_says_failed(tmp_path):
    """`seis evolve` as a user runs it (its own Prefect server, the real flow)."""
    run = tmp_path / "run"
    # two chains side by side, each failing its one session (the same library entry fails in both)
    out = subprocess.run([sys.executable, "-m", "seis.cli", "evolve", "--protocol", "branching", "--chains", "2",
                          "--sessions", "1", "--model", "tiny-qwen3", "--device", "cpu", "--gate", "smoke",
                          "--out", str(run), "--store", str(tmp_path / "store"),
                          "--agent-library", str(_library_that_never_applies(tmp_path))],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "every session errored (2 of 2), nothing was judged" in errors[0], out.stderr
    assert "a new run is needed" in errors[0] and "--resume" not in errors[0]  # resuming would end the same way
    assert "Traceback" not in out.stderr
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and status["sessions_done"] == 2, status
    assert status["message"].startswith("every session errored") and "new run" in status["note"]
    said = out.stdout + out.stderr
    assert "[c1 s0] " in said and "-> error, kept parent" in said and "best so far none retained" in said
    # the summary and best.json were still written
    assert (run / "summary.md").is_file() and json.loads((run / "best.json").read_text()) is None
