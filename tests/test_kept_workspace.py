"""What the host keeps of an agent's workspace after a session is inert for whoever opens it later, root included:
no repository whose configuration runs commands (git's core.fsmonitor runs on `git status`, which a shell prompt
calls on entering the directory), no extended attribute (a default ACL gives every file created there later a
mode the umask does not cut), and no key left in a file's name. Each test fails on the code before its fix. CPU
only, a second or two."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from seis.agents.llm.agent import finish_workspace
from seis.agents.llm.confine import sanitize_workspace
from seis.agents.llm.redact import Redactor
from seis.engine_import import ENGINE_TEMPLATE
from seis.workspace import prepare_workspace

KEY = "sk-ant-api03-" + "Qw7eR2" * 6 + "zXy34BB"


def _ws(tmp_path: Path):
    return prepare_workspace(ENGINE_TEMPLATE, tmp_path / "session" / "workspace", [])


def _plant_repository(root: Path, mark: Path) -> None:
    """A git repository whose fsmonitor hook leaves `mark`: as `.git`, and as a bare repository (a directory that
    git takes for one from its HEAD, objects and refs) anywhere in the tree."""
    hook = f"touch {mark}; false"
    for gitdir in (root / ".git", root / "engine" / "sub" / ".git", root / "engine" / "bare"):
        gitdir.mkdir(parents=True)
        (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
        for sub in ("objects", "refs/heads"):
            (gitdir / sub).mkdir(parents=True)
            (gitdir / sub / "keep").write_text("")
        (gitdir / "config").write_text(f"[core]\n\trepositoryformatversion = 0\n\tfsmonitor = {hook}\n"
                                       f"\tbare = {str(gitdir.name != '.git').lower()}\n")
    (root / "engine" / "hgrepo" / ".hg").mkdir(parents=True)
    (root / "engine" / "hgrepo" / ".hg" / "hgrc").write_text(f"[hooks]\npre-status = touch {mark}\n")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git, the tool that would run the hook")
def test_no_repository_survives_for_git_to_run_its_configured_commands(tmp_path):
    ws = _ws(tmp_path)
    mark = tmp_path / "hook-ran"
    _plant_repository(ws.root, mark)
    problems = sanitize_workspace(ws.root)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)}  # no repository above the test's own dirs
    for where in (ws.root, ws.root / "engine", ws.root / "engine" / "sub", ws.root / "engine" / "bare"):
        if where.is_dir():
            subprocess.run(["git", "status"], cwd=where, env=env, capture_output=True, timeout=30)
    assert not mark.exists(), "a command the agent configured ran on the host"
    assert not (ws.root / ".git").exists() and not (ws.root / "engine" / "sub" / ".git").exists()
    # an agent's own .git is no part of any tree: gone without a word; a bare repository or another tool's
    # metadata is no engine code: reported, so the session is rejected
    assert not any(".git" in line.split(":")[0] for line in problems), problems
    assert any(line.startswith("engine/bare/HEAD:") for line in problems), problems
    assert any(line.startswith("engine/hgrepo/.hg/:") for line in problems), problems


def _default_acl_all_rwx() -> bytes:
    """A POSIX default ACL (the kernel's xattr form): owner, group and others rwx, whatever the umask."""
    undefined = 0xFFFFFFFF
    entries = [(0x01, 7, undefined), (0x04, 7, undefined), (0x20, 7, undefined)]  # USER_OBJ, GROUP_OBJ, OTHER
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_no_extended_attribute_survives_to_set_the_modes_of_files_made_there_later(tmp_path):
    ws = _ws(tmp_path)
    engine = ws.root / "engine"
    try:
        os.setxattr(engine, "system.posix_acl_default", _default_acl_all_rwx())
        os.setxattr(engine / "__init__.py", "user.seis-note", b"planted")
    except OSError as e:
        pytest.skip(f"this file system keeps no ACLs or user attributes ({e.strerror}): nothing to survive here")
    assert sanitize_workspace(ws.root) == []
    assert os.listxattr(engine) == [] and os.listxattr(engine / "__init__.py") == []
    old = os.umask(0o022)
    try:
        fd = os.open(engine / "written_later.txt", os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
    finally:
        os.umask(old)
    assert (engine / "written_later.txt").stat().st_mode & 0o777 == 0o644


def test_a_key_is_blanked_whatever_the_file_is_named_and_a_name_holding_one_goes(tmp_path):
    ws = _ws(tmp_path)
    engine = ws.root / "engine"
    (engine / "notes: see below.py").write_text(f"k = {KEY!r}\n")   # ": " as in "<path>: <why>"
    (engine / f"cache-{KEY}").mkdir()
    (engine / f"cache-{KEY}" / "a.py").write_text("x = 1\n")
    rejected = finish_workspace(ws, Redactor(secrets=[KEY]))
    assert rejected and "held an API key" in rejected
    assert KEY not in (engine / "notes: see below.py").read_text()
    assert not any(KEY in p.name for p in engine.iterdir())
    assert KEY not in rejected


class _Interrupted:
    """An agent that leaves a repository with a hook, a setuid file and a link to a host file, and is then
    interrupted (Ctrl-C, a cancellation) before it could make its tree safe."""

    def __init__(self, mark: Path, host_file: Path):
        self.mark, self.host_file = mark, host_file

    def edit(self, workspace, context):
        _plant_repository(workspace.root, self.mark)
        suid = workspace.root / "engine" / "suid"
        suid.write_text("x")
        suid.chmod(0o4777)
        (workspace.root / "engine" / "link").symlink_to(self.host_file)
        raise KeyboardInterrupt


def test_an_interrupted_session_leaves_its_workspace_sanitized(tmp_path, monkeypatch):
    """The session's agent step ends by an interrupt: the workspace it leaves (kept for a resume to clear, or for
    someone to look at) holds no repository, setuid file or link all the same."""
    from seis.run_config import RunConfig
    from seis.session import steps
    from seis.session.spec import SessionSpec
    host_file = tmp_path / "host.env"
    host_file.write_text("KEY=x")
    monkeypatch.setattr(steps, "make_agent", lambda config: _Interrupted(tmp_path / "hook-ran", host_file))
    ws = _ws(tmp_path)
    spec = SessionSpec(run_id="r", chain="c0", chain_index=0, session=1, parent_snapshot="p",
                       session_dir=tmp_path / "session")
    with pytest.raises(KeyboardInterrupt):
        steps.run_agent(RunConfig(agent="offline"), spec, ws)
    assert not (ws.root / ".git").exists() and not (ws.root / "engine" / "bare" / "HEAD").exists()
    assert not (ws.root / "engine" / "link").is_symlink()
    assert not (ws.root / "engine" / "suid").stat().st_mode & 0o7000


def test_reports_the_harness_laid_out_are_not_taken_for_the_sessions_keys(tmp_path):
    """An earlier agent's report is redacted, then laid out read-only in every later workspace of its chain (and of
    its peers at a sync). Text the redactor leaves but the scan calls key-shaped ('ésk-' and 16 more letters and
    digits: no word boundary before 's' for the one, the bytes read as Latin-1 for the other) made every later
    session 'held an API key': rejected, the report blanked, the chain stuck for good. What the harness laid out
    is not the session's output; what the agent writes, a `peers/` of its own making included, is scanned."""
    from seis.agents import SessionBlock, render_report, stamp_verdict
    from seis.workspace import PeerMaterial, Report
    text = "See ésk-abcdefghijklmnop1 for why."
    md = Redactor().text(stamp_verdict(render_report(SessionBlock("c1", 0, "a", ("x",)), text, [], []),
                                       "retained", "t"))
    assert "ésk-abcdefghijklmnop1" in md  # what the redactor leaves as it is
    peer = PeerMaterial("c1", ENGINE_TEMPLATE, (Report("c1", 0, md, "retained"),))
    own = Report("c0", 0, md.replace("c1", "c0"), "retained")
    ws = prepare_workspace(ENGINE_TEMPLATE, tmp_path / "sync" / "workspace", [own], [peer])
    assert finish_workspace(ws, Redactor()) is None
    assert text in (ws.root / "reports" / "c0-000.md").read_text()
    assert text in (ws.root / "peers" / "c1" / "reports" / "c1-000.md").read_text()
    # a key the agent wrote is still found, in the engine and in a peers/ it made where none was laid out
    (ws.root / "engine" / "k.py").write_text(f"k = {KEY!r}\n")
    assert "engine/k.py: held an API key" in finish_workspace(ws, Redactor(secrets=[KEY]))
    ws = prepare_workspace(ENGINE_TEMPLATE, tmp_path / "alone" / "workspace", [own])
    (ws.root / "peers").mkdir()
    (ws.root / "peers" / "k.py").write_text(f"k = {KEY!r}\n")
    assert "peers/k.py: held an API key" in finish_workspace(ws, Redactor(secrets=[KEY]))
