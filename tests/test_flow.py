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

from seis.config import RunConfig
from seis.engine_import import ENGINE_TEMPLATE
from seis.store import SnapshotStore
from seis.workspace import tree_hash

LIBRARY = Path(__file__).resolve().parents[1] / "seis" / "agents" / "offline" / "library"


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness
    with prefect_test_harness():
        yield


def _run(tmp_path: Path, **values) -> pd.DataFrame:
    from flows.seis_flow import seis
    config = RunConfig(model="tiny-qwen3", device="cpu", gate="smoke", out=tmp_path / "run",
                       store=tmp_path / "store", **values)
    run_dir = Path(seis(config))
    return pd.read_parquet(run_dir / "summary.parquet")


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
def test_sync_chain_lineage_and_fan_in(harness, tmp_path, prepared_dir):
    lib = _library(tmp_path, "batched-scoring", "decode-pinned-metadata")
    df = _run(tmp_path, protocol="sync-chain", chains=2, sessions=2, sync_every=1, agent_library=lib)
    store = SnapshotStore(tmp_path / "store")
    vanilla = store.put(ENGINE_TEMPLATE)
    s0 = df[df.session == 0].set_index("chain")
    s1 = df[df.session == 1].set_index("chain")
    # session 0: both chains start from E0 and explore different transformations
    assert set(s0.parent_snapshot) == {vanilla}
    assert s0.retained.all() and s0.loc["c0", "applied"] != s0.loc["c1", "applied"]
    # session 1 follows a sync: each chain inherits its own retained engine and adopts what its peer retained
    for chain, peer in (("c0", "c1"), ("c1", "c0")):
        assert s1.loc[chain, "parent_snapshot"] == s0.loc[chain, "snapshot"]
        assert s1.loc[chain, "synced_from"] == peer
        assert s1.loc[chain, "adopted"] == s0.loc[peer, "applied"]
    # the fan-in delivered the peer's code and reports into the workspace
    ws = tmp_path / "run" / "chains" / "c0" / "001" / "workspace"
    assert tree_hash(ws / "peers" / "c1") == tree_hash(store.get(s0.loc["c1", "snapshot"], tmp_path / "peer"))
    assert list((ws / "peers" / "c1" / "reports").glob("c1-000.md"))
    assert (ws / "reports" / "c0-000.md").is_file()
    # both chains end on the same engine (both transformations), restorable byte for byte
    assert s1.loc["c0", "snapshot"] == s1.loc["c1", "snapshot"]
    restored = store.get(s1.loc["c0", "snapshot"], tmp_path / "restored")
    assert tree_hash(restored) == tree_hash(tmp_path / "run" / "chains" / "c0" / "001" / "workspace")
    for name in ("workspace.diff", "report.md", "gate.json", "agent.json"):
        assert (tmp_path / "run" / "chains" / "c1" / "001" / name).is_file()
    assert "retained" in (tmp_path / "run" / "chains" / "c1" / "001" / "report.md").read_text()
    assert (tmp_path / "run" / "figures" / "chain_speedups.png").read_bytes()[:4] == b"\x89PNG"


def test_chain_rejected_candidate_keeps_parent_and_is_not_retried(harness, tmp_path, prepared_dir):
    lib = _library(tmp_path, broken=True)
    df = _run(tmp_path, protocol="chain", chains=1, sessions=2, agent_library=lib).set_index("session")
    vanilla = SnapshotStore(tmp_path / "store").put(ENGINE_TEMPLATE)
    assert df.loc[0, "applied"] == "skip-last-layer"
    assert not df.loc[0, "retained"] and df.loc[0, "verdict"] == "fail" and df.loc[0, "reasons"]
    assert df.loc[0, "snapshot"] == vanilla                      # the parent stays retained
    assert df.loc[1, "parent_snapshot"] == vanilla
    assert df.loc[1, "verdict"] == "no_change" and df.loc[1, "applied"] == ""   # never retried


def test_branching_sessions_all_start_from_vanilla_and_the_best_is_post_validated(harness, tmp_path,
                                                                                   prepared_dir):
    lib = _library(tmp_path, "batched-scoring", "decode-pinned-metadata")
    df = _run(tmp_path, protocol="branching", chains=2, sessions=1, agent_library=lib, post_validate="quick")
    vanilla = SnapshotStore(tmp_path / "store").put(ENGINE_TEMPLATE)
    assert set(df.parent_snapshot) == {vanilla}
    assert set(df.applied) == {"batched-scoring", "decode-pinned-metadata"}
    best = (tmp_path / "run" / "best.json").read_text()
    best_snapshot = df.loc[df.dev_speedup_vs_vanilla.idxmax(), "snapshot"]
    assert best_snapshot in best
    postval = json.loads((tmp_path / "run" / "postval" / "postval.json").read_text())
    assert Path(postval["config"]["engine_dir"]).name == "engine"
    assert tree_hash(tmp_path / "run" / "postval" / "engine") == SnapshotStore(tmp_path / "store").info(
        best_snapshot).tree_hash
    assert json.loads((tmp_path / "run" / "postval" / "metrics.json").read_text())["gsm8k"]["delta_points"] == 0


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


def test_prefect_yaml_deployments_are_valid_runs():
    import yaml
    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "prefect.yaml").read_text())
    names = {d["name"]: d for d in spec["deployments"]}
    assert set(names) == {"branching", "chain", "sync-chain"}
    for name, d in names.items():
        assert d["entrypoint"] == "flows/seis_flow.py:seis" and d["schedules"]
        config = RunConfig(**d["parameters"]["config"])
        assert config.protocol == name
    assert RunConfig(**names["sync-chain"]["parameters"]["config"]).sync_every == 3
