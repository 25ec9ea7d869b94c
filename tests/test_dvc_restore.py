"""A colleague's restore: snapshots made in one clone come back in another clone, from the default DVC remote
(outside every checkout), after `git pull && dvc pull` or on demand; `dvc plots show` needs no internet."""
from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from seis.engine_import import ENGINE_TEMPLATE
from seis.postval import fetch_snapshot
from seis.store import SnapshotStore, dvc_command
from seis.workspace import tree_hash
from seis.workspace.tree import copy_tree

REPO_ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(dvc_command() is None or shutil.which("git") is None, reason="needs DVC and git")


def _run(*cmd: str, cwd: Path) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed in {cwd}: {done.stderr or done.stdout}"
    return done.stdout


def _git(*args: str, cwd: Path) -> str:
    return _run("git", "-c", "user.name=seis-test", "-c", "user.email=seis-test@localhost", *args, cwd=cwd)


def _dvc(*args: str, cwd: Path) -> str:
    return _run(*dvc_command(), *args, cwd=cwd)


def _inside(path: Path, root: Path) -> bool:
    return path.resolve() == root.resolve() or root.resolve() in path.resolve().parents


def test_a_second_clone_restores_a_snapshot_from_the_default_remote(tmp_path, monkeypatch):
    home = tmp_path / "home"  # the project's default remote is ~/.cache/seis/dvc-remote: keep it in tmp_path
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    engine = tmp_path / "engine"
    copy_tree(ENGINE_TEMPLATE, engine)  # a fixed copy: others may edit engine_template/ meanwhile
    want = tree_hash(engine)

    # Alice: a repository with the project's DVC configuration; a run stores a retained engine.
    alice = tmp_path / "alice"
    alice.mkdir()
    _git("init", "-q", cwd=alice)
    _dvc("init", "-q", cwd=alice)
    shutil.copyfile(REPO_ROOT / ".dvc" / "config", alice / ".dvc" / "config")
    remote = Path(_dvc("config", "remote.local.url", cwd=alice).strip())
    assert remote == home / ".cache" / "seis" / "dvc-remote"
    sid = SnapshotStore(alice / "store").put(engine, {"run": "r", "chain": "c0", "session": 0})
    assert SnapshotStore(alice / "store").info(sid).dvc
    assert remote.is_dir() and any(p.is_file() for p in remote.rglob("*")), "put() must push to the remote"

    # What git sees of the store is exactly the metadata a colleague needs: the engine files are DVC's.
    untracked = _git("status", "--porcelain", "--untracked-files=all", "store", cwd=alice).split("\n")
    assert sorted(line[3:] for line in untracked if line) == sorted(
        [f"store/{sid}.dvc", f"store/{sid}.json", "store/.gitignore"])
    _git("add", "-A", cwd=alice)
    _git("commit", "-q", "-m", "a retained engine", cwd=alice)

    # Bob and Carol clone it elsewhere; Alice's checkout and cache are then gone, only the remote is left.
    bob, carol = tmp_path / "bob", tmp_path / "carol"
    _git("clone", "-q", str(alice), str(bob), cwd=tmp_path)
    _git("clone", "-q", str(alice), str(carol), cwd=tmp_path)
    shutil.rmtree(alice)
    for clone in (bob, carol):
        assert not _inside(remote, clone) and not (clone / "store" / sid).exists()

    _dvc("pull", cwd=bob)  # git pull && dvc pull: the whole repository's data comes back
    assert tree_hash(bob / "store" / sid) == want
    # What `seis post-validate --snapshot ID` does first: the engine restored byte for byte into its out dir.
    assert tree_hash(fetch_snapshot(sid, bob / "store", tmp_path / "bob-postval" / "engine")) == want

    # Without `dvc pull`, the snapshot is fetched from the remote on demand.
    assert tree_hash(fetch_snapshot(sid, carol / "store", tmp_path / "carol-postval" / "engine")) == want
    assert (carol / ".dvc" / "cache").is_dir()


def test_the_default_remote_lies_outside_the_checkout():
    remotes = dict(line.split(None, 1) for line in _dvc("remote", "list", cwd=REPO_ROOT).splitlines() if line)
    default = [name for name, rest in remotes.items() if rest.endswith("(default)")]
    assert default == ["local"], remotes
    url = remotes["local"].removesuffix("(default)").strip()  # as DVC resolves it (~ expanded)
    if not re.match(r"^[a-z0-9+]+://", url):  # a local folder (the default): never inside the checkout
        path = Path(url) if Path(url).is_absolute() else REPO_ROOT / ".dvc" / url
        assert not _inside(path, REPO_ROOT), url


def test_dvc_plots_render_offline(tmp_path):
    """The project's plots are images; `dvc plots show` embeds them in a page that loads nothing from the net."""
    stage = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["postval-e0"]
    plots = [next(iter(p)) if isinstance(p, dict) else p for p in stage["plots"]]
    assert plots and all(p.endswith(".png") for p in plots), plots
    import inspect

    from seis.postval.figures import write_figures
    made = inspect.getsource(write_figures)  # the figures `seis post-validate` writes, as (name, function) pairs
    assert all(p.startswith("data/postval/") and f'("{Path(p).stem}", ' in made for p in plots), plots

    repo = tmp_path / "repo"
    (repo / "data" / "postval").mkdir(parents=True)
    _dvc("init", "-q", "--no-scm", cwd=repo)
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"postval-e0": {
        "cmd": "true", "plots": stage["plots"]}}}), encoding="utf-8")
    for p in plots:  # a valid 1x1 PNG stands in for each figure (DVC copies images as they are)
        (repo / p).write_bytes(base64.b64decode(
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="))
    _dvc("plots", "show", "-o", "out", cwd=repo)
    html = (repo / "out" / "index.html").read_text(encoding="utf-8")
    images = re.findall(r'<img src="([^"]+)"', html)
    assert len(images) == len(plots) and all((repo / "out" / src).is_file() for src in images)
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "the page must not load anything from the network"
