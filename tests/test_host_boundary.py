"""The host code around the agent sandbox, attacked as a hostile agent would (issue: nothing an agent does reaches
the host): a link swapped while the host copies the tree, setuid and world-writable files left for the cleanup,
a dev benchmark left running in the background, memory and /dev/shm floods, and the host layout a process inside
could aim with. Each test fails on the code before its fix. CPU only; real sandboxes, real races."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import seis
from llm_fakes import BenchStub
from seis.agents import SessionContext
from seis.agents.llm import LLMSettings
from seis.agents.llm.cli_agent import CliAgent
from seis.agents.llm.confine import AGENT_LIMITS, AgentSandbox, sanitize_workspace
from seis.agents.llm.devbench import SubprocessDevBenchmark, run_tree
from seis.agents.llm.shell import run_shell
from seis.engine_import import ENGINE_TEMPLATE
from seis.sandbox.cgroup import MemoryCage
from seis.workspace import Report, TreeError, copy_tree, prepare_workspace

PROJECT = Path(seis.__file__).resolve().parents[1]
SECRET = "host-secret-7f3e9a1c-do-not-leak"


def _ws(tmp_path: Path):
    return prepare_workspace(ENGINE_TEMPLATE, tmp_path / "session" / "workspace",
                             [Report("c0", 0, "## Earlier\nA report.\n", "retained")])


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A private host file (0600, in a 0700 directory) and a directory beside it holding another copy."""
    home = tmp_path / "host-home"
    home.mkdir(mode=0o700)
    (home / ".netrc").write_text(f"machine api password {SECRET}\n")
    os.chmod(home / ".netrc", 0o600)
    (home / "dir").mkdir()
    (home / "dir" / "x.py").write_text(f"# {SECRET}\n")
    return home


def _swap_forever(root: Path, secret: Path, stop: threading.Event) -> None:
    """Replace a file and a directory of the tree by links to host files and back, as fast as possible."""
    f, d = root / "engine" / "leak.py", root / "engine" / "d"
    while not stop.is_set():
        for path, target in ((f, secret / ".netrc"), (d, secret / "dir")):
            try:
                if path.is_dir() and not path.is_symlink():
                    os.rename(path, path.with_name(path.name + ".old"))
                else:
                    path.unlink(missing_ok=True)
                path.symlink_to(target)
                path.unlink()
                if path is d:
                    os.rename(path.with_name(path.name + ".old"), path)
                else:
                    path.write_text("benign = 1\n")
            except OSError:
                pass


def test_a_copy_racing_a_link_swap_never_reads_outside_the_tree(tmp_path, secret):
    """Without any freeze: the copy itself cannot be made to follow a link, however the tree changes under it."""
    root = tmp_path / "tree"
    copy_tree(ENGINE_TEMPLATE, root)
    (root / "engine" / "d").mkdir()
    (root / "engine" / "d" / "x.py").write_text("benign = 1\n")
    (root / "engine" / "leak.py").write_text("benign = 1\n")
    stop = threading.Event()
    swapper = threading.Thread(target=_swap_forever, args=(root, secret, stop), daemon=True)
    swapper.start()
    copies = refused = 0
    try:
        for i in range(300):
            dest = tmp_path / f"copy{i}"
            try:
                copy_tree(root, dest)
                copies += 1
            except TreeError:
                refused += 1
            for path in dest.rglob("*"):
                assert path.is_dir() or SECRET not in path.read_text(errors="replace"), path
    finally:
        stop.set()
        swapper.join()
    assert copies + refused == 300 and refused > 0  # the race did happen


@pytest.mark.skipif(os.geteuid() != 0, reason="a writable bind is given to the sandbox's user only by root")
def test_giving_a_writable_bind_to_the_sandbox_user_never_follows_a_link_swap(tmp_path, secret):
    """At every sandbox start root hands the writable binds (what earlier sandboxes wrote) to the sandbox's user:
    with a file and a directory swapped for links to host files meanwhile, no host file changes owner."""
    from seis.sandbox.process import _chown_tree
    root = tmp_path / "tree"
    copy_tree(ENGINE_TEMPLATE, root)
    (root / "engine" / "d").mkdir()
    (root / "engine" / "d" / "x.py").write_text("benign = 1\n")
    (root / "engine" / "leak.py").write_text("benign = 1\n")
    host = [secret, secret / ".netrc", secret / "dir", secret / "dir" / "x.py"]
    stop = threading.Event()
    swapper = threading.Thread(target=_swap_forever, args=(root, secret, stop), daemon=True)
    swapper.start()
    try:
        for _ in range(300):
            _chown_tree(root, 54321)
            assert [p.stat().st_uid for p in host] == [0] * len(host)
    finally:
        stop.set()
        swapper.join()
    assert (root / "engine" / "__init__.py").stat().st_uid == 54321


def _read_back(root) -> str:
    """The worst dev benchmark: it hands the agent every byte of the tree it was given (the real one returns an
    engine's build error, which the engine can fill with whatever its tree holds)."""
    texts = [p.read_text(errors="replace") for p in sorted(Path(root).rglob("*")) if p.is_file()]
    return "Dev benchmark\n" + "\n".join(texts)


def test_the_dev_benchmark_cannot_be_aimed_at_host_files_by_a_link_swap(tmp_path, secret):
    """A cli agent swaps links to a 0600 host file and directory while asking for the dev benchmark again and
    again: the host copies its tree only frozen and never through a link, so nothing of them comes back."""
    ws = _ws(tmp_path)
    swap = f"""
        mkdir -p engine/d; echo 'benign = 1' > engine/d/x.py; echo 'benign = 1' > engine/leak.py
        ( while :; do ln -sfn '{secret}/.netrc' engine/leak.py; rm -f engine/leak.py; echo 'b = 1' > engine/leak.py
          done ) &
        ( while :; do mv engine/d engine/d.old; ln -s '{secret}/dir' engine/d; rm engine/d; mv engine/d.old engine/d
          done ) &
        for i in 1 2 3 4 5 6 7 8 9 10 11 12; do $SEIS_DEV_BENCHMARK; done
        printf 'done\\nCHANGES: none\\n' > SESSION_REPORT.md
    """
    bench = BenchStub(_read_back)
    agent = CliAgent(LLMSettings("cli", command=swap, wall_s=90), bench, sandbox=AgentSandbox())
    result = agent.edit(ws, SessionContext("c0", 1))
    transcript = (tmp_path / "session" / "transcript.jsonl").read_text()
    # each request either ran on a frozen copy or was refused (frozen mid-swap, the tree held a link)
    assert '"dev_benchmark_runs": 12' in transcript and bench.calls >= 1
    assert transcript.count("Dev benchmark") + transcript.count("dev benchmark refused") >= 12
    assert SECRET not in transcript and SECRET not in result.report_markdown


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): os.lstat(p).st_mode for p in [root, *root.rglob("*")]}


def test_cleanup_leaves_no_setuid_setgid_sticky_or_world_writable_entry(tmp_path):
    """The agent (its own uid inside) leaves setuid, setgid, sticky and world-writable files and directories; the
    cleanup (root) takes them over: none of those bits may survive, on any entry."""
    ws = _ws(tmp_path)
    plant = ("cd engine && echo x > suid && chmod 4555 suid && echo x > sgid && chmod 2755 sgid && "
             "echo x > both && chmod 6777 both && echo x > open && chmod 0666 open && "
             "mkdir sticky && chmod 1777 sticky && mkdir gdir && chmod 2775 gdir && echo y > gdir/f && chmod 4711 gdir/f "
             "&& ls -l && stat -c '%a %n' suid both")
    done = run_shell(plant, ws.root, 30, AgentSandbox())
    assert done.returncode == 0, done.output
    assert "4555 suid" in done.output and "6777 both" in done.output  # planted as the sandbox's user
    assert sanitize_workspace(ws.root) == []
    for rel, mode in _modes(ws.root).items():
        assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH | stat.S_IWGRP), (rel, oct(mode))
        if os.geteuid() == 0:
            assert os.lstat(ws.root / rel).st_uid == 0
    assert stat.S_IMODE(os.lstat(ws.root / "engine" / "suid").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(ws.root / "engine" / "open").st_mode) == 0o644


def test_cleanup_refuses_hard_links_and_control_files(tmp_path):
    ws = _ws(tmp_path)
    done = run_shell("ln engine/model.py engine/twin.py && echo '*' > engine/.dvcignore && echo x > .gitignore "
                     "&& echo y > engine/w.dvc", ws.root, 30, AgentSandbox())
    assert done.returncode == 0, done.output
    text = "\n".join(sanitize_workspace(ws.root))
    for what in ("hard link", "engine/.dvcignore", ".gitignore", "engine/w.dvc"):
        assert what in text, (what, text)
    assert not (ws.root / "engine" / ".dvcignore").exists()


HEARTBEAT = """
import sys, time
from pathlib import Path
from seis.sandbox.scope import die_with_parent
if len(sys.argv) > 2:
    die_with_parent(int(sys.argv[2]))
beat = Path(sys.argv[1])
for _ in range(600):
    beat.write_text(str(time.time()))
    time.sleep(0.1)
"""


class HeartbeatBench(SubprocessDevBenchmark):
    """The real benchmark's process handling (run_tree, its process group, the session's scope), with a child
    that only writes a heartbeat for a minute instead of building engines."""

    def argv(self, candidate: Path) -> list[str]:
        return [sys.executable, "-c", HEARTBEAT, self.model]


def _beating(beat: Path, within_s: float = 1.0) -> bool:
    if not beat.exists():
        return False
    before = beat.read_text()
    time.sleep(within_s)
    return beat.read_text() != before


def test_a_background_dev_benchmark_dies_with_the_session(tmp_path):
    """The cli agent starts the dev benchmark in the background and exits: the benchmark it asked for must be dead
    when the session returns (before the gate times anything), not run on beside the gate."""
    ws = _ws(tmp_path)
    beat = tmp_path / "beat"
    command = ("($SEIS_DEV_BENCHMARK >/dev/null 2>&1 &); sleep 3; "
               "printf 'bye\\nCHANGES: none\\n' > SESSION_REPORT.md")
    agent = CliAgent(LLMSettings("cli", command=command, wall_s=30), HeartbeatBench(model=str(beat)),
                     sandbox=AgentSandbox())
    agent.edit(ws, SessionContext("c0", 1))
    assert beat.exists(), "the benchmark never started"
    assert not _beating(beat)


def test_the_dev_benchmark_dies_with_the_seis_process_that_started_it(tmp_path):
    """SEIS killed with SIGKILL (no cleanup runs): its dev benchmark child, in a process group of its own, must not
    run on."""
    beat = tmp_path / "beat"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import os, sys; from seis.agents.llm.devbench import run_tree\n"
        f"run_tree([sys.executable, '-c', {HEARTBEAT!r}, {str(beat)!r}, str(os.getpid())], 120)\n")],
        env={**os.environ, "PYTHONPATH": str(PROJECT)})
    deadline = time.monotonic() + 30
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _beating(beat), "the benchmark child did not start"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(0.5)
    assert not _beating(beat)
    assert "--watch-pid" in SubprocessDevBenchmark(model="m").argv(tmp_path)  # the real one asks for the same


def test_dev_shm_and_scratch_are_bounded(tmp_path):
    ws = _ws(tmp_path)
    done = run_shell("head -c 700M /dev/zero > /dev/shm/a && head -c 700M /dev/zero > /dev/shm/b; echo rc=$?",
                     ws.root, 60, AgentSandbox())
    assert "No space left" in done.output and "rc=1" in done.output, done.output
    assert AGENT_LIMITS.shm_bytes <= 1 * 2**30 and AGENT_LIMITS.sandbox_memory_bytes is not None


def _cage_possible() -> bool:
    cage = MemoryCage.create("seis-probe", 2**30) if os.geteuid() == 0 else None
    if cage is not None:
        cage.remove()
    return cage is not None


@pytest.mark.parametrize("hog", [
    "python3 -c \"x = bytearray(900 * 2**20); x[::4096] = b'a' * len(x[::4096]); print('SURVIVED')\"",
    "head -c 900M /dev/zero > /tmp/fill && echo SURVIVED",  # tmpfs pages count against the sandbox too
])
def test_a_memory_hog_is_stopped_at_the_sandbox_bound_and_says_so(tmp_path, hog):
    from dataclasses import replace
    ws = _ws(tmp_path)
    box = AgentSandbox(limits=replace(AGENT_LIMITS, sandbox_memory_bytes=300 * 2**20))
    done = run_shell(hog, ws.root, 60, box)
    assert "SURVIVED" not in done.output, done.output
    if _cage_possible():
        assert done.limit_note and "memory bound" in done.render(60), done.render(60)


def test_the_host_layout_is_not_shown_inside(tmp_path):
    """What item 1's attack needed to aim: bwrap's command line (every bind's host path), the editable install's
    record of the checkout, the host's cgroup layout under /sys/fs."""
    ws = _ws(tmp_path)
    site = subprocess.run([sys.executable, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True).stdout.strip()
    probe = (f"tr '\\0' ' ' < /proc/1/cmdline; echo; ls -A /sys/fs | wc -l; "
             f"grep -rl '{PROJECT}' '{site}' 2>/dev/null | head; echo GREP-DONE; "
             "python3 -c 'import seis' 2>&1 | tail -1")
    done = run_shell(probe, ws.root, 60, AgentSandbox())
    out = done.output
    assert "GREP-DONE" in out, out
    cmdline, shown_fs = out.splitlines()[0], out.splitlines()[1]
    assert "bwrap" in cmdline and str(ws.root) not in cmdline and "--bind" not in cmdline, cmdline
    assert shown_fs.strip() == "0"
    assert out.split("GREP-DONE")[0].splitlines()[2:] == [], out  # no file there names the checkout
    assert "Error processing line" not in out and "ModuleNotFoundError" in out


@pytest.mark.parametrize("flood, what", [
    ("i=0; while :; do head -c 1000000 /dev/urandom > f$i; i=$((i+1)); done", "GiB on disk"),  # many 1 MB files
    ("i=0; while :; do : > e$i; i=$((i+1)); done", "entries"),                                   # many empty files
])
def test_filling_the_host_disk_through_the_workspace_is_stopped(tmp_path, flood, what):
    """Per-file limits alone let an agent fill the host's disk with many files: the sandbox is killed once its
    workspace passes the bound, and the result says why."""
    from dataclasses import replace
    ws = _ws(tmp_path)
    box = AgentSandbox(limits=replace(AGENT_LIMITS, max_written_bytes=64 * 2**20, max_written_entries=3000))
    t0 = time.monotonic()
    done = run_shell(f"cd engine && {flood}", ws.root, 60, box)
    elapsed = time.monotonic() - t0
    assert elapsed < 30 and done.returncode is not None  # killed by the watch, not the time limit
    assert done.limit_note and what in done.render(60), done.render(60)
    written = sum(p.stat().st_size for p in (ws.root / "engine").iterdir() if p.is_file())
    # stopped within a look or two of the bound: past it by at most what this machine writes in three periods
    from seis.sandbox.write_watch import WATCH_PERIOD_S
    assert written < 64 * 2**20 + written / elapsed * 3 * WATCH_PERIOD_S, (written, elapsed)


def test_an_exception_raised_while_a_command_runs_kills_its_sandbox(tmp_path):
    """A step timeout raised into the waiting thread from outside, or an interrupt: the sandbox dies with the call
    instead of running on, unwatched, after it."""
    from seis.agents.llm.confine import run_confined
    ws = _ws(tmp_path)
    boxes = []

    def started_then_interrupted(box):
        boxes.append(box)
        assert box.members()  # the command is running
        raise TimeoutError("the step's time is up")

    with pytest.raises(TimeoutError):
        run_confined(["sleep", "60"], AgentSandbox().policy(ws.root), 30, on_start=started_then_interrupted)
    assert boxes and boxes[0].members() == []


def test_an_engines_log_is_read_through_the_descriptor_the_host_made_it_with(tmp_path):
    """An engine's stderr tail goes into the error the gate reports (and agents read). Read by path, a log put in
    its place (a link to a host file) would hand the host file's end to whoever reads that error."""
    import types

    from seis.engine_host.client import EngineProcess
    secret = tmp_path / "host-secret"
    secret.write_text("HOST-SECRET-LINE\n")
    log = tmp_path / "seis-engine-x.log"
    log.write_text("Traceback: the engine's own words\n")
    fd = os.open(log, os.O_RDONLY)
    try:
        log.unlink()
        log.symlink_to(secret)  # what a process that could reach the path would leave there
        engine = types.SimpleNamespace(stderr_path=log, _stderr_fd=fd)
        tail = EngineProcess._stderr_tail(engine)
    finally:
        os.close(fd)
    assert "the engine's own words" in tail and "HOST-SECRET" not in tail


@pytest.mark.parametrize("plant", ["setuid file", "link to a host file"])
def test_the_gates_retained_copy_takes_no_mode_and_follows_no_link_the_candidate_chose(plant, tmp_path):
    """On PASS the gate copies the judged tree (the candidate's private copy) to the session's retained
    directory, after the candidate's engine is dead. A setuid-root file in it would stay setuid in the retained
    tree, and a link would copy a host file's bytes: the copy keeps neither."""
    from seis.evaluator.errors import ReferenceFailure
    from seis.evaluator.gate import _retain
    from seis.evaluator.snapshot import Snapshot, tree_sha256
    from seis.workspace.tree import copy_tree

    judged = tmp_path / "judged"
    copy_tree(ENGINE_TEMPLATE, judged)
    host = tmp_path / "host.env"
    host.write_text("KEY=host-secret\n")
    dest = tmp_path / "retained"
    if plant == "setuid file":
        tool = judged / "engine" / "tool"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o4777)
        _retain(Snapshot(judged, judged, tree_sha256(judged)), dest)
        assert stat.S_IMODE((dest / "engine" / "tool").stat().st_mode) == 0o755
        assert all(not p.stat().st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH) for p in dest.rglob("*"))
    else:
        sha = tree_sha256(judged)
        (judged / "engine" / "keys.env").symlink_to(host)
        with pytest.raises(ReferenceFailure, match="could not be copied"):
            _retain(Snapshot(judged, judged, sha), dest)
        assert not any(p.name == "keys.env" and p.is_file() for p in dest.rglob("*"))
    assert host.read_text() == "KEY=host-secret\n"
