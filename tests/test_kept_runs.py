"""The run states kept in docs/runs (docs/runs/README.md) must stay resumable: a change to the run records' schema
or to the store that would make `seis evolve --resume` redo (or refuse) their sessions fails here, not on the GPU
host that continues them."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from seis.run_config import RunConfig
from seis.session.resume import finished
from seis.session.reuse import reused_from
from seis.session.rundir import RunDir
from seis.store import SnapshotStore

ARCHIVES = sorted((Path(__file__).resolve().parents[1] / "docs" / "runs").glob("*.tgz"))
LEFT_OUT = {".prefect", "parent", "gated", "workspace"}  # what docs/runs/README.md says an archive omits


def _unpack(archive: Path, dest: Path) -> tuple[Path, Path]:
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert all(n == "runs" or n.startswith("runs/") for n in names), "an archive holds runs/ alone"
        assert not LEFT_OUT & {part for n in names for part in Path(n).parts[2:]}, "it holds what it should omit"
        tar.extractall(dest, filter="data")
    runs = [p for p in (dest / "runs").iterdir() if p.name != "store"]
    assert len(runs) == 1, f"one run and its store per archive, found {[p.name for p in runs]}"
    return runs[0], dest / "runs" / "store"


def test_docs_runs_holds_an_archive():
    assert ARCHIVES, "docs/runs/README.md lists archives; none found"


@pytest.mark.parametrize("archive", ARCHIVES, ids=lambda p: p.name)
def test_a_kept_run_resumes_with_every_recorded_session(archive: Path, tmp_path: Path):
    run_root, store_root = _unpack(archive, tmp_path)
    run = RunDir.open(run_root)
    config = RunConfig.model_validate_json(run.recorded_config_json())
    assert config.out.name == run_root.name and config.store.name == "store"
    store = SnapshotStore(store_root, use_dvc=False)
    # A resumed run judges against the reference it recorded, not the checkout's (E0 may have changed since): a kept
    # run must carry its E0 itself, and every recorded gate must have judged against that very tree.
    vanilla = run.recorded_vanilla()
    assert vanilla in store, "the kept run does not carry the E0 it recorded"
    e0 = store.info(vanilla).tree_hash

    session_dirs = sorted(p.parent for p in run_root.glob("chains/*/*/outcome.json"))
    assert session_dirs and len(session_dirs) == run.sessions_recorded()
    assert run.status().sessions_done == len(session_dirs)
    assert len(session_dirs) < config.chains * config.sessions, "a finished run's archive is not kept here"
    for session_dir in session_dirs:
        outcome = finished(session_dir, store)
        assert outcome is not None, f"{session_dir.relative_to(run_root)} would be redone on resume"
        assert outcome.parent_snapshot in store
        judged = reused_from(session_dir)  # a verdict taken from the session that gated the same candidate
        gate = json.loads(((run_root / judged if judged else session_dir) / "gate.json").read_text())
        verdict = gate["verdict"]
        assert gate["hashes"]["reference_tree"] == e0
        assert outcome.verdict == verdict and (verdict == "pass" or not outcome.retained)
    for info in store.list():  # every stored engine restores byte for byte (get checks the tree hash)
        store.get(info.id, tmp_path / "restored" / info.id)
