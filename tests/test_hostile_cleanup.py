"""Host code that starts sandboxes over, and cleans up after, trees a hostile agent or engine wrote: a chain of
directories thousands deep (past Python's recursion limit), links to host files, 0500 directories. A sandbox start
refuses such a bind with a clear error and leaks neither its host-wide uid lease nor its memory cgroup; the gate's
and a run's scratch cleanup removes such a tree without raising (the verdict still comes back) and without touching
a host file. Each test fails on the code before its fix. CPU only; real sandboxes where one is cheap."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from deep_trees import DEEP, chain, host_file, no_deep_leftovers  # noqa: F401 (fixtures)
from seis.sandbox import process as P
from seis.sandbox.process import TooDeep
from seis.workspace.tree import MAX_DEPTH, remove_tree

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="uid leases, chown and chmod of binds happen only as root")


def _hostile(root: Path, host_file: Path) -> None:
    """What a sandboxed engine or agent can leave in a directory it may write."""
    chain(root / "deep", DEEP)
    (root / "link").symlink_to(host_file)
    (root / "dirlink").symlink_to(host_file.parent, target_is_directory=True)
    (root / "locked" / "inner").mkdir(parents=True)
    (root / "locked" / "inner" / "f").write_text("x")
    (root / "locked").chmod(0o500)


def _untouched(host_file: Path) -> None:
    assert host_file.read_text() == "KEY=host-secret"
    st = host_file.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, os.geteuid())
    assert stat.S_IMODE(host_file.parent.stat().st_mode) == 0o700


def _leases_held() -> list[int]:
    """The sandbox uids this process holds a lease on (an open descriptor of its lock file)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(P._LOCK_DIR) + "/"):
            held.append(int(target.rsplit("/", 1)[1]))
    return sorted(held)


# ---- sandbox start: no leaked lease, a clear error ------------------------------------------------------------------
@as_root
def test_shell_calls_over_a_workspace_thousands_deep_fail_clearly_and_leak_no_uid_lease(tmp_path):
    """The agent nests its workspace 1500 deep, then calls run_shell again and again: every call is refused with a
    message saying why, the host keeps no uid lease taken (before: a RecursionError out of the start, and one
    more of the host's 999 sandbox uids taken for ever on every call), and once the tree is gone the shell works."""
    from seis.agents.llm.confine import AgentSandbox
    from seis.agents.llm.shell import run_shell
    ws = tmp_path / "ws"
    (ws / "engine").mkdir(parents=True)
    (ws / "engine" / "__init__.py").write_text("x = 1\n")
    chain(ws / "nest", DEEP)
    before = _leases_held()
    for _ in range(5):
        out = run_shell("echo hi", ws, 30, AgentSandbox())
        assert out.error is not None and f"nested more than {MAX_DEPTH} deep" in out.error
        assert "/workspace/nest/d/d/" in out.error and str(tmp_path) not in out.error  # the agent's view only
        assert _leases_held() == before
    remove_tree(ws / "nest")
    out = run_shell("echo ok", ws, 30, AgentSandbox())
    assert (out.error, out.returncode, out.output.strip()) == (None, 0, "ok")
    assert _leases_held() == before


class _FakeCage:
    removed = 0

    def enter_argv(self) -> list[str]:
        return []

    def oom_kills(self) -> int:
        return 0

    def remove(self) -> None:
        _FakeCage.removed += 1


@as_root
@pytest.mark.parametrize("fail_in", ["_chown_tree", "_readable_by_others"])
def test_any_failure_between_the_lease_and_the_start_releases_the_lease_and_the_cgroup(tmp_path, monkeypatch,
                                                                                     fail_in):
    """Not only a deep tree: whatever goes wrong while the binds are prepared (here an error no caller expects)
    gives the uid lease and the memory cgroup back before it reaches the caller."""
    from seis.sandbox.policy import Bind, Limits, SandboxPolicy

    def boom(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(P, fail_in, boom)
    monkeypatch.setattr(P.MemoryCage, "create", classmethod(lambda cls, name, limit: _FakeCage()))
    _FakeCage.removed = 0
    (tmp_path / "rw").mkdir()
    (tmp_path / "ro").mkdir()
    policy = SandboxPolicy((Bind(tmp_path / "rw", "/rw", writable=True), Bind(tmp_path / "ro", "/ro")), {},
                           limits=Limits(sandbox_memory_bytes=2**30))
    before = _leases_held()
    for i in range(5):
        box = P.SandboxedProcess(["true"], policy)
        with pytest.raises(RuntimeError, match="boom"):
            box.start()
        assert _leases_held() == before
        assert (_FakeCage.removed, box.cage, box.proc) == (i + 1, None, None)


@as_root
def test_preparing_binds_thousands_deep_is_refused_not_recursed_into(tmp_path, host_file):
    """The walks that hand a writable bind to the sandbox's user and make a read-only one readable go through
    descriptors, without recursion: a tree MAX_DEPTH deep is walked to its bottom, one thousands deep is a
    TooDeep (before: RecursionError), and a link to a host file is neither chowned nor chmodded through."""
    tree = tmp_path / "tree"
    chain(tree, MAX_DEPTH)
    (tree / "link").symlink_to(host_file)
    (tree / "dirlink").symlink_to(host_file.parent, target_is_directory=True)
    bottom = tree / ("d/" * MAX_DEPTH + "f")
    P._readable_by_others(tree)
    assert stat.S_IMODE(bottom.stat().st_mode) == 0o604
    P._chown_tree(tree, 54321)
    assert bottom.stat().st_uid == 54321 and bottom.parent.stat().st_uid == 54321
    assert (tree / "link").lstat().st_uid == 54321  # the link itself, never its target
    _untouched(host_file)

    chain(bottom.parent / "deeper", DEEP)
    with pytest.raises(TooDeep, match=f"more than {MAX_DEPTH} deep"):
        P._chown_tree(tree, 54321)
    with pytest.raises(TooDeep, match=f"more than {MAX_DEPTH} deep"):
        P._readable_by_others(tree)
    _untouched(host_file)


# ---- cleanup of what sandboxed code wrote ---------------------------------------------------------------------------
def _stub_gate(monkeypatch, plant) -> None:
    """run_gate with everything but its scratch directory's lifecycle stubbed out: `plant` runs where the engines
    would (it gets the candidate's cache dir), and the gate's verdict is a plain 'fail'."""
    from seis.evaluator import gate as G
    monkeypatch.setattr(G, "_setup", lambda config, tmp, roles: SimpleNamespace(model_dir=tmp, cache_root=tmp))
    workloads = SimpleNamespace(budget=SimpleNamespace(max_seq_len=64))
    monkeypatch.setattr(G, "load_gate_workloads", lambda config, model_dir: workloads)
    monkeypatch.setattr(G, "read_model_limits", lambda model_dir: (0, 0))
    engine = SimpleNamespace(role="candidate", close=lambda: None)
    monkeypatch.setattr(G, "_handles", lambda config, setup, max_seq_len, trusted, held: {"candidate": engine})
    monkeypatch.setattr(G, "_judge", lambda config, setup, *a: plant(setup.cache_root / "cache-candidate"))
    monkeypatch.setattr(G, "_gate_result", lambda *a: SimpleNamespace(verdict="fail"))


def test_the_gate_reaches_its_verdict_over_a_hostile_engine_cache(tmp_path, monkeypatch, host_file):
    """A candidate engine leaves a chain 1500 deep, links to host files and a 0500 directory in its writable
    cache: the gate still returns its verdict (before: RecursionError from the temporary directory's cleanup),
    removes all of it and touches no host file."""
    from seis.evaluator.gate import GateConfig, run_gate
    seen: list[Path] = []

    def plant(cache: Path) -> None:
        cache.mkdir()
        _hostile(cache, host_file)
        seen.append(cache.parent)
    _stub_gate(monkeypatch, plant)
    result = run_gate(GateConfig(candidate=tmp_path / "candidate", model="tiny"))
    assert result.verdict == "fail"
    assert seen and not os.path.lexists(seen[0])
    _untouched(host_file)


def test_a_run_scratch_dir_full_of_hostile_trees_is_removed_without_error(tmp_path, monkeypatch, host_file):
    """A run's scratch dir holds the caches sandboxed engines wrote: at the run's end (and at the next attempt's
    start, over what a killed one left) it is removed best-effort, never raising (before: RecursionError)."""
    from seis.session import resources
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    run_dir = tmp_path / "run"
    left = resources.run_scratch_path(run_dir)
    _hostile(left, host_file)  # what an attempt killed mid-run left
    with resources.scratch(run_dir) as root:
        assert root == left and list(root.iterdir()) == []
        _hostile(root / "engine-cache", host_file)
    assert not os.path.lexists(root)
    _untouched(host_file)


def test_resume_clears_an_interrupted_sessions_hostile_workspace(tmp_path, host_file):
    """A session cut off before its workspace was sanitized leaves the agent's tree as it was: a resumed run
    removes it without recursion and without following its links."""
    from seis.session.resume import clear
    session = tmp_path / "session"
    _hostile(session / "workspace", host_file)
    clear(session)
    assert not os.path.lexists(session)
    clear(session)  # already gone: nothing to do
    link = tmp_path / "left-link"
    link.symlink_to(host_file.parent, target_is_directory=True)
    clear(link)
    assert not os.path.lexists(link)
    _untouched(host_file)


def test_the_crash_and_cancel_hook_removes_a_hostile_scratch_dir_and_still_marks_the_run(tmp_path, monkeypatch,
                                                                                         host_file):
    """The flow's on_crashed / on_cancellation hook removes the run's scratch dir (engines' caches) as hostile
    input too: a chain deeper than the recursion limit neither stops it before the run's status and registry entry
    are updated nor follows a link (before: shutil.rmtree, RecursionError)."""
    import tasks.cleanup as cleanup
    from seis.session.resources import Registry
    from seis.session.status import read_status, write_status

    reg = Registry(tmp_path / "registry")
    run_dir, scratch = tmp_path / "run", tmp_path / "scratch"
    run_dir.mkdir()
    write_status(run_dir, "running", flow_run_id="fr-1")
    _hostile(scratch, host_file)
    reg.add_run("fr-1", run_dir, scratch)
    monkeypatch.setattr(cleanup, "registry", lambda: reg)
    monkeypatch.setattr(cleanup, "release_flow_run", lambda *a: 0)     # no GPU leases, no server in this test
    monkeypatch.setattr(cleanup, "_end_task_runs", lambda *a: 0)
    monkeypatch.setattr(cleanup, "_cancel_children", lambda *a: 0)
    state = SimpleNamespace(is_cancelled=lambda: True, is_cancelling=lambda: False, message="by the test",
                            type=SimpleNamespace(value="CANCELLED"))
    cleanup.release_run(None, SimpleNamespace(id="fr-1", name="test-run"), state)
    assert not os.path.lexists(scratch)
    assert read_status(run_dir).state == "cancelled" and reg.run("fr-1") is None
    _untouched(host_file)


@as_root
def test_an_interrupt_while_a_sandbox_starts_ends_it_and_gives_its_uid_back(monkeypatch):
    """An interrupt (Ctrl-C, SIGTERM, a cancelled run) between start()'s first look at the flag and the moment
    the sandbox is listed for kill_all(): that kill_all() never saw it, so start() looks again once it is listed.
    Before, the sandbox started and ran on with nothing left to kill it."""
    import subprocess
    import threading

    from seis.sandbox.policy import SandboxPolicy
    interrupted = threading.Event()
    monkeypatch.setattr(P, "_INTERRUPTED", interrupted)
    real_popen = subprocess.Popen

    def popen_then_interrupt(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        interrupted.set()
        P.kill_all()  # the interrupt's own kill: this sandbox is not listed yet
        return proc
    monkeypatch.setattr(P.subprocess, "Popen", popen_then_interrupt)
    before = _leases_held()
    box = P.SandboxedProcess(["sleep", "600"], SandboxPolicy((), {}))
    with pytest.raises(P.SandboxError, match="interrupted"):
        box.start()
    assert box.proc.poll() is not None and box.members() == [] and _leases_held() == before


def test_a_launcher_stopped_before_it_became_bwrap_counts_as_its_sandboxs_leftover():
    """A sandbox's launcher passes through shells (memory cgroup, OOM score) and prlimit before it execs bwrap.
    Stopped or stuck there when its owner died, it was no leftover of its uid (only a process named bwrap was):
    it lived on, and held the uid's memory cgroup, so every later sandbox of that uid started without one."""
    import signal
    import subprocess
    import time
    uid = P.UID_BASE + P.UID_COUNT - 1
    launcher = subprocess.Popen(["sh", "-c", 'kill -STOP $$; exec "$@"', "sh", "prlimit", "--core=0:0", "--",
                                 "bwrap", "--args", "9", "--", "setpriv", f"--reuid={uid}", "--", "true"],
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while b"T" not in P._states(launcher.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert launcher.pid in P._leftovers({uid})
        assert launcher.pid not in P._leftovers({uid - 1})
    finally:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()


def test_a_host_account_in_the_lease_range_is_never_leased_nor_killed_as_a_leftover(monkeypatch):
    """The leases' uids lie in Debian's range for accounts packages create: a uid the host has as a user was leased
    all the same, and that user's processes were SIGKILLed as a dead sandbox's leftovers by every lease and sweep."""
    import signal
    import subprocess
    from seis.sandbox import sweep_leftovers
    probe = P._UidLease()  # the uid the next lease would get, made an account of the host
    probe.release()
    # The user runs as the range's last uid, which the lease of a test beside this one (unaware of the account)
    # will not reach and kill as its own.
    accounts = {probe.uid, P.UID_BASE + P.UID_COUNT - 1}
    monkeypatch.setattr(P, "_is_account", lambda uid: uid in accounts)
    user = subprocess.Popen(["setpriv", f"--reuid={max(accounts)}", "--regid=65534", "--clear-groups", "--",
                             "sleep", "60"])
    (P._LOCK_DIR / str(max(accounts))).touch()  # as a lease of it, made before it became an account, leaves
    try:
        lease = P._UidLease()
        lease.release()
        assert lease.uid not in accounts
        assert user.pid not in P._leftovers(accounts)
        sweep_leftovers()
        assert user.poll() is None
    finally:
        os.kill(user.pid, signal.SIGKILL)
        user.wait()


# ---- a run as an ordinary user: directories the sandbox left without its owner's permissions ----------------------
def _as_ordinary_user(fn) -> dict:
    """fn() run as an ordinary user, as SEIS runs when it is not root: its sandboxes then write as that same user, so
    what they leave is the host's own, but only through the modes they left (root's override of them hid this).
    As root: in a forked child that drops to `nobody` first; its answer (a JSON object) comes back through a pipe."""
    import json
    import seis.tables  # noqa: F401 (imported lazily by the cleanup's problem lines: before the fork, not in it)
    if os.geteuid() != 0:
        return fn()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but its own files from here on, then _exit
        code = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.umask(0o022)
            out = fn()
            os.write(write_fd, json.dumps(out).encode())
            code = 0
        except BaseException as e:  # noqa: BLE001
            os.write(write_fd, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _entries(root: str) -> list[tuple[str, int]]:
    """(path under root, mode) of everything there, walked as root walks it: directories opened whatever their mode."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            found.append((os.path.relpath(path, root), os.lstat(path).st_mode))
    return found


def test_an_ordinary_users_run_cleans_and_removes_what_the_sandbox_locked_away_from_its_owner():
    """An agent in a run as an ordinary user hides a setuid file (setuid to the operator, whom any local user who runs
    it becomes), a world-writable directory and a link in a directory it leaves without read permission for its
    owner (mode 0311): the cleanup could not list it, rejected the session and left all three in the kept workspace.
    And a candidate's JIT cache holding directories of modes 0000 to 0500 made remove_tree raise PermissionError, out
    of the gate's scratch cleanup (no verdict: the run stops), a resume's clear or a dev benchmark's scratch: even a
    0500 directory cannot be moved to another parent, as that rewrites its '..' entry. Both now give such a directory
    its owner's permissions through a descriptor of it (never through a name a link could stand in), then go on."""
    def attack() -> dict:
        from seis.agents.llm.confine import sanitize_workspace
        top = tempfile.mkdtemp(prefix="seis-ordinary-")
        ws = os.path.join(top, "workspace")
        hidden = os.path.join(ws, "engine", "hidden")
        os.makedirs(os.path.join(hidden, "open"))
        Path(ws, "engine", "__init__.py").write_text("")
        Path(hidden, "tool").write_text("#!/bin/sh\nid\n")
        os.chmod(os.path.join(hidden, "tool"), 0o4755)
        os.chmod(os.path.join(hidden, "open"), 0o777)
        os.symlink("/etc/passwd", os.path.join(hidden, "link"))
        os.makedirs(os.path.join(ws, "engine", "sealed", "inner"))
        os.chmod(os.path.join(ws, "engine", "sealed"), 0o000)
        os.chmod(hidden, 0o311)
        problems = sanitize_workspace(Path(ws))
        for dirpath, dirnames, _ in os.walk(ws):   # what is left, as root would see it (the test's own look)
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), os.lstat(os.path.join(dirpath, name)).st_mode | 0o700)
        left = [(rel, mode) for rel, mode in _entries(ws)
                if mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH) or stat.S_ISLNK(mode)]
        cache = os.path.join(top, "scratch", "cache-candidate")
        for i, mode in enumerate((0o000, 0o100, 0o300, 0o500, 0o700)):
            d = os.path.join(cache, f"triton-{i}", "locked", "deeper")
            os.makedirs(d)
            Path(d, "kernel.bin").write_text("x")
            os.chmod(os.path.join(cache, f"triton-{i}", "locked", "deeper"), mode)
            os.chmod(os.path.join(cache, f"triton-{i}", "locked"), mode)
        os.chmod(cache, 0o500)
        try:
            remove_tree(os.path.join(top, "scratch"))
            removal = "removed" if not os.path.exists(os.path.join(top, "scratch")) else "left"
        except OSError as e:
            removal = f"raised {e!r}"
        try:
            remove_tree(top)
        except OSError:
            pass
        return {"problems": problems, "left": [[rel, oct(mode)] for rel, mode in left], "removal": removal}

    seen = _as_ordinary_user(attack)
    assert "error" not in seen, seen
    assert seen["left"] == [], seen
    assert seen["removal"] == "removed", seen
    assert any("hidden/link" in p and "symlink" in p for p in seen["problems"]), seen
