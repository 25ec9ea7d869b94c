"""The `seis` Prefect flow end to end on CPU (tiny-qwen3, real gate at smoke sizes, the offline agent)."""
from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from seis.run_config import RunConfig
from seis.session.params import resolve_config
from seis.engine_import import ENGINE_TEMPLATE
from seis.store import SnapshotStore
from seis.workspace import tree_hash
from sync_chain_lineage import check_sync_chain_lineage

LIBRARY = Path(__file__).resolve().parents[1] / "seis" / "agents" / "offline" / "library"


def _run(tmp_path: Path, **values) -> pd.DataFrame:
    return _run_with_id(tmp_path, **values)[0]


def _run_with_id(tmp_path: Path, **values) -> tuple[pd.DataFrame, str]:
    """The run's summary and its Prefect flow run id (to read its task runs, logs and artifacts back)."""
    from flows.seis_flow import seis
    config = RunConfig(model="tiny-qwen3", device="cpu", gate="smoke", out=tmp_path / "run",
                       store=tmp_path / "store", **values)
    state = seis(config, return_state=True)
    run_dir = Path(state.result())
    return pd.read_parquet(run_dir / "summary.parquet"), str(state.state_details.flow_run_id)


def _library(tmp_path: Path, *names: str, broken: bool = False) -> Path:
    lib = tmp_path / "library"
    for name in names:
        shutil.copytree(LIBRARY / name, lib / name)
    if broken:  # a transformation that skips the last decoder layer: the gate must reject it
        d = lib / "skip-last-layer"
        d.mkdir(parents=True)
        model = ENGINE_TEMPLATE / "engine" / "model.py"
        old = model.read_text()
        new = old.replace("for layer in self.layers:", "for layer in self.layers[:-1]:")
        assert new != old
        diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/engine/model.py",
                                    "b/engine/model.py")
        (d / "patch.diff").write_text("".join(diff))
        (d / "meta.yaml").write_text("name: skip-last-layer\nrationale: one layer less to compute\n"
                                     "expected_effect: faster\ntarget_files: [engine/model.py]\n")
    return lib


# Flows that gate take `prepared_dir`: the gates read the prepared workloads (made from the GSM8K source).
@pytest.fixture(scope="module")
def sync_run(harness, tmp_path_factory, prepared_dir):
    """One sync-chain run shared by the tests that read it: 2 chains x 3 sessions, a fan-in before each session
    after the first. After s1 both chains hold one engine (each adopted the other's entry), and at s2 both try the
    same next entry on it."""
    tmp_path = tmp_path_factory.mktemp("sync")
    lib = _library(tmp_path, "greedy-multistep-decode", "batched-scoring", "decode-pinned-metadata")
    df, flow_run_id = _run_with_id(tmp_path, protocol="sync-chain", chains=2, sessions=3, sync_every=1,
                                   agent_library=lib)
    return tmp_path, df, flow_run_id


@pytest.mark.slow
def test_sync_chain_lineage_and_fan_in(sync_run):
    tmp_path, df, _ = sync_run
    store = SnapshotStore(tmp_path / "store")
    check_sync_chain_lineage(df, store.id_len)
    s0 = df[df.session == 0].set_index("chain")
    s1 = df[df.session == 1].set_index("chain")
    # the fan-in delivered the peer's code and reports into the workspace
    ws = tmp_path / "run" / "chains" / "c0" / "001" / "workspace"
    assert tree_hash(ws / "peers" / "c1") == tree_hash(store.get(s0.loc["c1", "snapshot"], tmp_path / "peer"))
    assert list((ws / "peers" / "c1" / "reports").glob("c1-000.md"))
    assert (ws / "reports" / "c0-000.md").is_file()
    # the engine both chains end on is restorable byte for byte
    restored = store.get(s1.loc["c0", "snapshot"], tmp_path / "restored")
    assert tree_hash(restored) == tree_hash(tmp_path / "run" / "chains" / "c0" / "001" / "workspace")
    for name in ("workspace.diff", "report.md", "gate.json", "agent.json"):
        assert (tmp_path / "run" / "chains" / "c1" / "001" / name).is_file()
    assert "retained" in (tmp_path / "run" / "chains" / "c1" / "001" / "report.md").read_text()
    assert (tmp_path / "run" / "figures" / "chain_speedups.png").read_bytes()[:4] == b"\x89PNG"


def _read_back(flow_run_id: str):
    """The flow run's task runs, logs and artifacts, through Prefect's own client."""
    import asyncio

    from prefect import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter,
                                                FlowRunFilterId, LogFilter, LogFilterFlowRunId)

    async def read():
        async with get_client() as client:
            task_runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
            return task_runs, logs, artifacts
    return asyncio.run(read())


def _graph(task_runs) -> dict[str, set[str]]:
    """Each task run's name -> the names of its upstream task runs (data edges and wait_for; not nesting)."""
    names = {str(t.id): t.name for t in task_runs}
    return {t.name: {names[str(i.id)] for key, inputs in t.task_inputs.items() if key != "__parents__"
                     for i in inputs if getattr(i, "id", None) and str(i.id) in names} for t in task_runs}


STEPS = ("session", "prepare-workspace", "agent-edit", "build-and-gate", "snapshot", "report")


@pytest.mark.slow
def test_ui_task_runs_are_named_and_tagged_by_chain_and_session(sync_run):
    task_runs, _, _ = _read_back(sync_run[2])
    by_name = {t.name: t for t in task_runs}
    assert len(by_name) == len(task_runs)                       # every name says which run it is
    expected = {f"{c}/s{s} {step}" for c in ("c0", "c1") for s in (0, 1) for step in STEPS}
    assert expected | {"s1 fan-in"} <= set(by_name), sorted(by_name)
    for c in ("c0", "c1"):
        for s in (0, 1):
            for step in STEPS:
                assert {f"chain:{c}", f"session:{s}"} <= set(by_name[f"{c}/s{s} {step}"].tags)
    assert "session:1" in by_name["s1 fan-in"].tags and not any(t.startswith("chain:")
                                                                 for t in by_name["s1 fan-in"].tags)


@pytest.mark.slow
def test_ui_graph_shows_only_chain_lineage_and_fan_ins(sync_run):
    task_runs, _, _ = _read_back(sync_run[2])
    graph = _graph(task_runs)
    assert graph["s1 fan-in"] == {"c0/s0 session", "c1/s0 session"}
    for c in ("c0", "c1"):
        assert graph[f"{c}/s0 session"] == {"snapshot-vanilla"}
        assert graph[f"{c}/s1 session"] == {f"{c}/s0 session", "s1 fan-in"}     # lineage + fan-in, no peer
        for s in (0, 1):
            steps = [f"{c}/s{s} {step}" for step in STEPS[1:]]
            assert graph[steps[0]] == set()
            for before, after in zip(steps, steps[1:]):                # one session: a plain sequence of steps
                assert graph[after] == {before}, (after, graph[after])


@pytest.mark.slow
def test_ui_gpu_wait_is_logged_as_waiting(sync_run):
    task_runs, logs, _ = _read_back(sync_run[2])
    gates = {str(t.id) for t in task_runs if t.name.endswith("build-and-gate")}
    for task_run_id in gates:
        messages = [log.message for log in logs if str(log.task_run_id) == task_run_id]
        waiting = next(i for i, m in enumerate(messages) if m.startswith("waiting for the GPU slot"))
        acquired = next(i for i, m in enumerate(messages) if m.startswith("GPU slot acquired after waiting"))
        assert waiting < acquired, messages


@pytest.mark.slow
def test_ui_artifacts_have_stable_keys_code_fenced_gates_and_rounded_numbers(sync_run):
    import re
    tmp_path, df, flow_run_id = sync_run
    _, _, artifacts = _read_back(flow_run_id)
    by_key = {a.key: a for a in artifacts}
    # the same keys every run of a deployment (here: a local run of flow `seis`), so the per-key history is useful
    assert {"seis-summary", "seis-sessions", *(f"seis-session-{c}-s{s}" for c in ("c0", "c1") for s in (0, 1))} \
        <= set(by_key), sorted(by_key)
    session = by_key["seis-session-c0-s1"].data
    fenced = re.search(r"```text\n(.*?)\n```", session, re.S)
    assert fenced and "Gate verdict: PASS" in fenced.group(1) and "Speed on cpu" in fenced.group(1)
    assert re.search(r"dev speedup vs vanilla +\| \d+\.\d{3}x +\|", session)
    assert re.search(r"\| wall +\| \d+\.\d s +\|", session)
    summary = by_key["seis-summary"].data
    assert str(tmp_path / "run" / "figures" / "chain_speedups.png") in summary
    assert "| chain" in summary and "c1" in summary
    rows = json.loads(by_key["seis-sessions"].data)
    assert len(rows) == len(df) == 6
    for row in rows:
        for column, digits in (("dev_speedup_vs_vanilla", 3), ("dev_speedup_vs_parent", 3), ("wall_s", 1)):
            value = row[column]
            assert value is None or round(value, digits) == value, (column, value)
    numbers = re.findall(r"\d+\.(\d+)", summary.split("| chain", 1)[1])
    assert numbers and max(len(n) for n in numbers) <= 3


@pytest.mark.slow
def test_chain_rejected_candidate_keeps_parent_and_is_not_retried(harness, tmp_path, prepared_dir):
    lib = _library(tmp_path, broken=True)
    df = _run(tmp_path, protocol="chain", chains=1, sessions=2, agent_library=lib).set_index("session")
    vanilla = SnapshotStore(tmp_path / "store").put(ENGINE_TEMPLATE)
    assert df.loc[0, "applied"] == "skip-last-layer"
    assert not df.loc[0, "retained"] and df.loc[0, "verdict"] == "fail" and df.loc[0, "reasons"]
    assert df.loc[0, "snapshot"] == vanilla                      # the parent stays retained
    assert df.loc[1, "parent_snapshot"] == vanilla
    assert df.loc[1, "verdict"] == "no_change" and df.loc[1, "applied"] == ""   # never retried


@pytest.mark.slow
def test_branching_sessions_all_start_from_vanilla_and_the_best_is_post_validated(harness, tmp_path,
                                                                                   prepared_dir):
    lib = _library(tmp_path, "batched-scoring", "decode-pinned-metadata")
    df = _run(tmp_path, protocol="branching", chains=2, sessions=1, agent_library=lib, post_validate="quick")
    vanilla = SnapshotStore(tmp_path / "store").put(ENGINE_TEMPLATE)
    assert set(df.parent_snapshot) == {vanilla}
    assert set(df.applied) == {"batched-scoring", "decode-pinned-metadata"}
    # the best by the run's own rule (a gain its gate could not tell from noise ranks as 1.0x), not the top ratio
    from seis.session.progress import pick_best_of_run
    from seis.session.resume import recorded_outcomes
    best_snapshot = json.loads((tmp_path / "run" / "best.json").read_text())["snapshot"]
    assert best_snapshot in set(df.snapshot)
    assert best_snapshot == pick_best_of_run(tmp_path / "run", recorded_outcomes(tmp_path / "run"))[0].snapshot
    postval = json.loads((tmp_path / "run" / "postval" / "postval.json").read_text())
    assert Path(postval["config"]["engine_dir"]).name == "engine"
    assert tree_hash(tmp_path / "run" / "postval" / "engine") == SnapshotStore(tmp_path / "store").info(
        best_snapshot).tree_hash
    assert json.loads((tmp_path / "run" / "postval" / "metrics.json").read_text())["gsm8k"]["delta_points"] == 0


@pytest.mark.slow
def test_a_candidate_the_run_already_judged_takes_that_verdict_without_a_second_gate(sync_run, tmp_path):
    """At s2 both chains try the same next entry on the same engine: the second of those identical candidates is
    not gated again; a tree that differs by a byte, or a recorded verdict from other evaluator code, is."""
    from seis.evaluator import GateConfig, GateResult
    from seis.session.reuse import reuse_verdict
    from seis.session.timeline import gate_spans

    run_tmp, df, _ = sync_run
    s1 = df[df.session == 1].set_index("chain")
    s2 = df[df.session == 2].set_index("chain")
    assert s1.loc["c0", "snapshot"] == s1.loc["c1", "snapshot"]
    assert s2.loc["c0", "applied"] == s2.loc["c1", "applied"] != ""
    assert s2.retained.all() and s2.loc["c0", "snapshot"] == s2.loc["c1", "snapshot"]
    assert s2.loc["c0", "dev_speedup_vs_vanilla"] == s2.loc["c1", "dev_speedup_vs_vanilla"]
    run = run_tmp / "run"
    dirs = {c: run / "chains" / c / "002" for c in ("c0", "c1")}
    gated = [c for c, d in dirs.items() if (d / "gate.json").is_file()]
    assert len(gated) == 1
    other = "c1" if gated == ["c0"] else "c0"
    record = json.loads((dirs[other] / "gate-reused.json").read_text())
    assert record["session"] == f"chains/{gated[0]}/002"
    assert record["speed"] == json.loads((dirs[gated[0]] / "gate.json").read_text())["speed"]  # its own copy
    assert "was gated in chains/" in (dirs[other] / "report.md").read_text()
    assert len(gate_spans(run)) == 5  # six sessions, five gates

    # The boundary: the recorded verdict goes only to exactly that tree, judged by this evaluator.
    result = GateResult.model_validate_json((dirs[gated[0]] / "gate.json").read_text())
    config = GateConfig.model_validate(result.config)
    same = tmp_path / "same"
    shutil.copytree(dirs[other] / "workspace", same)
    for name in ("reports", "peers"):
        shutil.rmtree(same / name, ignore_errors=True)
    probe = tmp_path / "probe" / "chains" / "c9" / "000"
    probe.mkdir(parents=True)
    shutil.copytree(run / "verdicts", tmp_path / "probe" / "verdicts")
    shutil.copytree(run / "chains" / gated[0], tmp_path / "probe" / "chains" / gated[0])
    reused = reuse_verdict(config.model_copy(update={"candidate": same}), probe, probe / "gated")
    assert reused is not None and reused.result.hashes.candidate_tree == result.hashes.candidate_tree
    assert tree_hash(probe / "gated") == tree_hash(same)
    changed = tmp_path / "changed"
    shutil.copytree(same, changed)
    with open(changed / "engine" / "__init__.py", "a") as f:
        f.write("\n")
    assert reuse_verdict(config.model_copy(update={"candidate": changed}), probe, probe / "g2") is None
    assert not (probe / "g2").exists()
    # another parent, or an index entry naming the judged session for a different tree, lends nothing
    assert reuse_verdict(config.model_copy(update={"candidate": same, "parent_snapshot": "0" * 16}), probe,
                         probe / "g4") is None
    from seis.evaluator.gate import evaluator_source_sha256
    from seis.evaluator.snapshot import tree_sha256
    from seis.session.reuse import verdict_key
    forged = verdict_key(config, tree_sha256(changed), evaluator_source_sha256())
    (tmp_path / "probe" / "verdicts" / f"{forged}.json").write_text(json.dumps({"session": f"chains/{gated[0]}/002"}))
    assert reuse_verdict(config.model_copy(update={"candidate": changed}), probe, probe / "g5") is None
    stale = tmp_path / "probe" / "chains" / gated[0] / "002" / "gate.json"
    stale.write_text(result.model_copy(update={"hashes": result.hashes.model_copy(
        update={"evaluator_source": "0" * 64})}).model_dump_json())
    assert reuse_verdict(config.model_copy(update={"candidate": same}), probe, probe / "g3") is None


def _evolve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seis.cli", "evolve", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--protocol", "ring"], "protocol"),
    (["--sessions", "2", "--sync-every", "3"], "sync_every (3) must not exceed sessions (2)"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--agent", "telepathy"], "agent"),
])
def test_bad_input_fails_before_any_work(tmp_path, args, message):
    out = _evolve("--out", str(tmp_path / "run"), "--store", str(tmp_path / "store"), *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()


def test_unwritable_or_used_output_dir_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = _evolve("--out", str(blocker / "run"))
    assert out.returncode == 2 and "not writable" in out.stderr
    used = tmp_path / "used"
    used.mkdir()
    (used / "old.txt").write_text("keep me")
    out = _evolve("--out", str(used))
    assert out.returncode == 2 and "not empty" in out.stderr
    assert (used / "old.txt").read_text() == "keep me"


def test_a_resume_refused_because_another_flow_holds_the_run_says_to_wait_not_to_resume(tmp_path):
    """While one flow works in a run directory, a second `--resume` of it is refused. The refusal ended with
    "continue with: seis evolve --resume DIR", the very command just refused."""
    from seis.session.rundir import RunDir
    out = tmp_path / "run"
    config = RunConfig(out=out, store=tmp_path / "store", model="tiny-qwen3", device="cpu", protocol="chain", chains=1,
                       sessions=1)
    run = RunDir.create(config.out, config.model_dump_json(indent=2))
    with run.lock():  # the other flow
        done = _evolve("--resume", str(out))
    assert done.returncode == 1 and "in use by another flow" in done.stderr, done.stderr
    assert "--resume" not in done.stderr and "wait for it" in done.stderr


def test_prefect_yaml_deployments_are_valid_runs():
    import yaml
    prefect_yaml = yaml.safe_load((Path(__file__).resolve().parents[1] / "prefect.yaml").read_text())
    names = {d["name"]: d for d in prefect_yaml["deployments"]}
    assert {"branching", "chain", "sync-chain"} <= set(names)
    for name, d in names.items():
        assert d["entrypoint"] == "flows/seis_flow.py:seis" and d["schedules"]
        config = resolve_config(d["parameters"].get("config"),
                                {k: v for k, v in d["parameters"].items() if k != "config"}).config
        if name in ("branching", "chain", "sync-chain"):
            assert config.protocol == name
    sync = names["sync-chain"]["parameters"]
    assert resolve_config(sync.get("config"), {k: v for k, v in sync.items() if k != "config"}).config.sync_every == 5


def test_gate_defaults_to_full_on_cuda_and_quick_elsewhere(tmp_path):
    assert RunConfig(out=tmp_path / "a", device="cuda").gate == "full"
    assert RunConfig(out=tmp_path / "b", device="cpu").gate == "quick"
    assert RunConfig(out=tmp_path / "c", device="cuda", gate="quick").gate == "quick"  # a choice is kept
    assert resolve_config(None, {"device": "cuda", "gate": None, "out": str(tmp_path / "d")}).config.gate == "full"


def test_two_runs_started_at_once_in_one_output_dir_never_overwrite_each_others_config(harness, tmp_path,
                                                                                       monkeypatch):
    """Two runs given one output dir (two deployments' default runs/<time> in the same second, a start repeated in a
    second terminal) both pass the check that it is empty; the second one to write config.json overwrote the first
    one's, so the run that held the directory worked under another run's recorded config (and a resume of it
    redid every session by that config). The second is refused, the first one's config.json stays."""
    import flows.seis_flow as seis_flow
    from seis.session.rundir import RunDir

    out = tmp_path / "run"
    mine = RunConfig(out=out, store=tmp_path / "store", model="tiny-qwen3", device="cpu", protocol="chain", chains=1,
                     sessions=1)
    other = mine.model_copy(update={"protocol": "branching", "sessions": 3})
    held = []
    real_limit = seis_flow.ensure_gpu_limit

    def other_run_starts_meanwhile(*args, **kwargs):   # after this flow's checks, before it writes its config
        run = RunDir.create(out, other.model_dump_json(indent=2))
        held.append(run.lock().__enter__())
        return real_limit(*args, **kwargs)
    monkeypatch.setattr(seis_flow, "ensure_gpu_limit", other_run_starts_meanwhile)
    try:
        state = seis_flow.seis(mine, return_state=True)
    finally:
        for lock in held:
            lock.__exit__(None, None, None)
    assert RunConfig.model_validate_json((out / "config.json").read_text()) == other
    assert state.is_failed() and state.message.startswith("refused before any work: "), state.message
    assert f"{out} holds a run" in state.message
    assert sorted(p.name for p in out.iterdir() if p.name != ".prefect") == [".run.lock", "config.json"]


def test_two_chains_remembering_one_verdict_at_once_both_succeed(tmp_path):
    """Two chains can reach the same candidate's verdict at the same moment; each write goes through a part file
    of its own (one shared temporary name let one chain's rename take the other's file away mid-write)."""
    import threading
    from types import SimpleNamespace

    from seis.session.reuse import VERDICTS, remember_verdict

    config = SimpleNamespace(model_dump=lambda **_: {"preset": "full"})
    result = SimpleNamespace(verdict="pass", hashes=SimpleNamespace(candidate_tree="t" * 64, evaluator_source="e"))
    errors = []
    (tmp_path / "run").mkdir()

    def remember(session: Path) -> None:
        try:
            for _ in range(3000):
                remember_verdict(config, session, result)
        except Exception as e:  # noqa: BLE001  (any error of either chain fails the test)
            errors.append(e)

    chains = [threading.Thread(target=remember, args=(tmp_path / "run" / "chains" / c / "002",)) for c in ("c0", "c1")]
    for t in chains:
        t.start()
    for t in chains:
        t.join()
    assert errors == []
    entries = list((tmp_path / "run" / VERDICTS).iterdir())
    assert len(entries) == 1 and json.loads(entries[0].read_text())["session"] in ("chains/c0/002", "chains/c1/002")
