"""DVC between colleagues: the committed dvc.lock matches the code and params, `dvc repro` prepares the workloads in a
fresh clone wherever GSM8K lies ($SEIS_GSM8K_DIR), `dvc push` + `dvc pull` carry them to another clone through the
team's remote, and `dvc metrics show` prints one short summary."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seis.store import dvc_command
from seis.workloads import WorkloadDataError, resolve_gsm8k_dir, verify_prepared
from seis.workloads.gsm8k import GSM8K_ENV
from seis.workloads.prepare import GSM8K_SOURCE_RECORD, gsm8k_source_bytes

REPO_ROOT = Path(__file__).resolve().parents[1]
# What a clone needs to run the workloads pipeline: DVC's configuration, stages, lock, params, data/ and the code.
PIPELINE = ("dvc.yaml", "dvc.lock", "params.yaml", ".dvc", ".dvcignore", ".gitignore", "data", "seis/__init__.py",
            "seis/workloads")
CHECKED_STAGES = ("gsm8k-source", "prepare-workloads", "postval-summary")
# What `dvc status` may say of a clean copy: the source stage always runs, and data/prepared is there only once pulled
# or made.
CLEAN_COPY_STATUS = {
    "gsm8k-source": [["always changed"]],
    "prepare-workloads": [[{"changed outs": {"data/prepared": why}}] for why in ("deleted", "not in cache")],
}
# postval-e0 is not checked: it depends on E0 and seis/postval, which move with every engine change; `dvc repro
# postval-summary` re-runs it (and the summary) when an engine is judged.
pytestmark = pytest.mark.skipif(dvc_command() is None or shutil.which("git") is None, reason="needs DVC and git")


def _gsm8k_source() -> Path | None:
    """Where this checkout's GSM8K source is ($SEIS_GSM8K_DIR, else ../shared/data/gsm8k), if anywhere."""
    try:
        return resolve_gsm8k_dir()
    except WorkloadDataError:
        return None


def _env(home: Path, gsm8k: Path | None) -> dict[str, str]:
    """This interpreter as the stages' `python`, HOME in tmp (the default remote is under ~), GSM8K where given."""
    env = {**os.environ, "HOME": str(home), "DVC_NO_ANALYTICS": "1", "GIT_CONFIG_NOSYSTEM": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop(GSM8K_ENV, None)
    return env | ({GSM8K_ENV: str(gsm8k)} if gsm8k else {})


def _run(*cmd: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)} failed in {cwd}: {done.stderr or done.stdout}"
    return done.stdout


def _git(*args: str, cwd: Path, env: dict[str, str]) -> str:
    return _run("git", "-c", "user.name=seis-test", "-c", "user.email=seis-test@localhost", *args, cwd=cwd, env=env)


def _dvc(*args: str, cwd: Path, env: dict[str, str]) -> str:
    return _run(*dvc_command(), *args, cwd=cwd, env=env)


def _pipeline_repo(dest: Path, env: dict[str, str]) -> Path:
    """A git repository holding this checkout's pipeline files as a commit would (tracked and new, not ignored)."""
    listed = _git("ls-files", "-co", "--exclude-standard", "-z", "--", *PIPELINE, cwd=REPO_ROOT, env=env)
    for name in filter(None, listed.split("\0")):
        if (REPO_ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / name, dest / name)
    _git("init", "-q", cwd=dest, env=env)
    _git("add", "-A", cwd=dest, env=env)
    _git("commit", "-q", "-m", "pipeline", cwd=dest, env=env)
    return dest


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A copy of the pipeline, never written by the tests that use it."""
    root = tmp_path_factory.mktemp("pipeline")
    (root / "home").mkdir()
    env = _env(root / "home", None)
    return _pipeline_repo(root / "repo", env), env


def test_dvc_lock_is_up_to_date_with_the_code_params_and_source(pipeline):
    repo, env = pipeline
    status = json.loads(_dvc("status", "--json", *CHECKED_STAGES, cwd=repo, env=env) or "{}")
    stale = {stage: changes for stage, changes in status.items() if changes not in CLEAN_COPY_STATUS.get(stage, [])}
    assert not stale, f"dvc.lock is stale: run `dvc repro prepare-workloads` and `dvc repro -s postval-summary` " \
                      f"and commit dvc.lock: {stale}"
    source = _gsm8k_source()
    if source is not None:  # the record the lock was made from is this source's
        assert gsm8k_source_bytes(source) == GSM8K_SOURCE_RECORD.read_bytes(), \
            "the GSM8K source differs from data/gsm8k_source.json; run `dvc repro prepare-workloads`"


def test_dvc_metrics_show_prints_one_short_summary(pipeline):
    repo, env = pipeline
    lines = _dvc("metrics", "show", cwd=repo, env=env).splitlines()
    assert len(lines) == 2 and lines[1].startswith("data/postval_summary.json"), lines
    assert len(lines[0].split()) <= 8, lines[0]  # Path and a few columns, not every speed row


def test_a_fresh_clone_reproduces_pushes_and_another_pulls(tmp_path):
    source = _gsm8k_source()
    if source is None:
        pytest.skip("no GSM8K source here ($SEIS_GSM8K_DIR or ../shared/data/gsm8k)")
    (tmp_path / "home").mkdir()
    env = _env(tmp_path / "home", None)
    origin = _pipeline_repo(tmp_path / "origin", env)
    # The team's shared remote, as the README sets it up: one committed URL every clone uses.
    _dvc("remote", "modify", "local", "url", str(tmp_path / "team-remote"), cwd=origin, env=env)
    _git("commit", "-q", "-m", "team remote", ".dvc/config", cwd=origin, env=env)
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    for clone in (alice, bob):
        _git("clone", "-q", str(origin), str(clone), cwd=tmp_path, env=env)
    assert not (tmp_path / "shared").exists()  # no clone has GSM8K beside it

    # Alice finds GSM8K through $SEIS_GSM8K_DIR; her run reproduces exactly the committed lock, and she shares it.
    alice_env = _env(tmp_path / "home", source)
    _dvc("repro", "prepare-workloads", cwd=alice, env=alice_env)
    assert not _git("status", "--porcelain", cwd=alice, env=env), "a fresh clone's run changed the lock"
    _dvc("push", cwd=alice, env=alice_env)

    # Bob has no GSM8K at all: `dvc pull` brings the workloads, and `dvc repro` finds them up to date.
    _dvc("pull", cwd=bob, env=env)
    verify_prepared(bob / "data" / "prepared")
    for path in (alice / "data" / "prepared").iterdir():
        assert (bob / "data" / "prepared" / path.name).read_bytes() == path.read_bytes(), path.name
    _dvc("repro", "prepare-workloads", cwd=bob, env=env)
    assert not _git("status", "--porcelain", cwd=bob, env=env)
