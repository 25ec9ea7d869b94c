"""What is retained: exactly the tree the gate judged, and never one holding a key (tried as a hostile agent
would: a key planted in engine code, in an encoded form, and a tree edited after the gate judged it)."""
from __future__ import annotations

import base64
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from seis.engine_import import ENGINE_TEMPLATE
from seis.evaluator.snapshot import tree_sha256
from seis.session import SessionSpec, decide, snapshot_if_retained
from seis.session.steps import gated_dir
from seis.store import SnapshotStore

KEY = "sk-ant-api03-test-RETAINED-SECRET-0123456789"


def _judged(tmp_path: Path) -> tuple[SessionSpec, SimpleNamespace]:
    spec = SessionSpec(run_id="r", chain="c0", chain_index=0, session=1, parent_snapshot="0" * 16,
                       session_dir=tmp_path / "session")
    shutil.copytree(ENGINE_TEMPLATE, gated_dir(spec), ignore=shutil.ignore_patterns("__pycache__"))
    result = SimpleNamespace(verdict="pass", speed=None,  # speed not measured: the checks alone decide
                             hashes=SimpleNamespace(candidate_tree=tree_sha256(gated_dir(spec))))
    return spec, result


def test_a_clean_passing_tree_is_retained_byte_for_byte(tmp_path: Path) -> None:
    spec, result = _judged(tmp_path)
    retained, _ = decide(spec, result, ())
    assert retained
    store = SnapshotStore(tmp_path / "store", use_dvc=False)
    sid = snapshot_if_retained(store, spec, result, retained)
    restored = store.get(sid, tmp_path / "restored")
    assert tree_sha256(restored) == result.hashes.candidate_tree


@pytest.mark.parametrize("plant", [KEY, base64.b64encode(KEY.encode()).decode(), KEY[::-1]])
def test_a_tree_holding_a_key_is_not_retained(plant: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    spec, _ = _judged(tmp_path)
    (gated_dir(spec) / "engine" / "constants.py").write_text(f"TOKEN = {plant!r}\n")
    result = SimpleNamespace(verdict="pass", speed=None,  # speed not measured: the checks alone decide
                             hashes=SimpleNamespace(candidate_tree=tree_sha256(gated_dir(spec))))
    retained, reasons = decide(spec, result, ())
    assert not retained and "secret" in reasons[0] and KEY not in reasons[0]


def test_a_tree_changed_after_the_gate_is_not_stored(tmp_path: Path) -> None:
    spec, result = _judged(tmp_path)
    (gated_dir(spec) / "engine" / "engine.py").write_text("raise SystemExit\n")  # edited after judgement
    store = SnapshotStore(tmp_path / "store", use_dvc=False)
    with pytest.raises(RuntimeError, match="not the tree the gate judged"):
        snapshot_if_retained(store, spec, result, True)
    assert store.list() == []


def test_a_failed_verdict_keeps_the_parent(tmp_path: Path) -> None:
    spec, result = _judged(tmp_path)
    result.verdict = "fail"
    assert decide(spec, result, ("dev.kl",)) == (False, ("dev.kl",))
    assert snapshot_if_retained(SnapshotStore(tmp_path / "store", use_dvc=False), spec, result, False) == \
        spec.parent_snapshot
