"""What a hostile agent leaves in its workspace for the host code that handles it afterwards: a flood of sparse
files (no disk used, hours of reading), directory chains deeper than Python's recursion limit hiding setuid files
and FIFOs, and search globs aimed at the host's filesystem. Each is attacked as an agent would (a real sandbox
where that is cheap) and must neither cross into the host nor stall or crash the run. Each test fails on the code
before its fix. CPU only; the whole file runs in a few seconds."""
from __future__ import annotations

import os
import stat
import time
from dataclasses import replace
from pathlib import Path

import pytest

from seis.agents.llm import agent as agent_mod
from seis.agents.llm import confine as confine_mod
from seis.agents.llm import secrets as secrets_mod
from seis.agents.llm import tools as tools_mod
from seis.agents.llm.agent import finish_workspace
from seis.agents.llm.cli_agent import _read_report
from seis.agents.llm.confine import AGENT_LIMITS, AgentSandbox, sanitize_workspace
from seis.agents.llm.redact import Redactor
from seis.agents.llm.secrets import find_secrets
from seis.agents.llm.shell import run_shell
from seis.agents.llm.tools import Toolbox
from seis.engine_import import ENGINE_TEMPLATE
from seis.sandbox import write_watch
from seis.session.steps import _diff_or_reason
from seis.workspace import PeerMaterial, Report, prepare_workspace, tree_hash
from deep_trees import DEEP, chain, no_deep_leftovers  # noqa: F401 (autouse)
from seis.workspace.tree import MAX_DEPTH, MAX_PATH_BYTES, TreeError, copy_tree

KEY = "sk-ant-api03-" + "Ab3dE9" * 6 + "xYz12AA"
SPARSE = 64 * 2**20  # each flood file: exactly the per-file limit, so no per-file rule removes it


def _ws(tmp_path: Path):
    return prepare_workspace(ENGINE_TEMPLATE, tmp_path / "session" / "workspace",
                             [Report("c0", 0, "## Earlier\nA report.\n", "retained")])


def _walk_lstat(root: Path):
    """(relative path, lstat) of every entry under root, iteratively (the test must not recurse either)."""
    stack = [root]
    while stack:
        d = stack.pop()
        for entry in os.scandir(d):
            st = entry.stat(follow_symlinks=False)
            yield os.path.relpath(entry.path, root), st
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))


# --- sparse files -------------------------------------------------------------------------------------------------

def test_the_disk_watch_counts_the_apparent_size_of_sparse_files(tmp_path):
    """`truncate -s 64M` uses no disk, so a watch counting blocks never fires while the agent makes files that
    every host reader reads at full length. The sandbox is killed once their apparent size passes the bound."""
    ws = _ws(tmp_path)
    box = AgentSandbox(limits=replace(AGENT_LIMITS, max_written_bytes=256 * 2**20))
    t0 = time.monotonic()
    done = run_shell("mkdir -p junk && for i in $(seq 10000); do truncate -s 64M junk/f$i; done; echo ALL-MADE",
                     ws.root, 60, box)
    assert time.monotonic() - t0 < 30 and done.returncode is not None  # the watch, not the time limit
    assert done.limit_note and "apparent size" in done.limit_note, done.render(60)
    assert "ALL-MADE" not in done.output
    assert len(os.listdir(ws.root / "junk")) < 2000


def test_bytes_without_a_name_are_stopped_by_the_free_space_floor(tmp_path, monkeypatch):
    """Files unlinked while their writer holds them open take disk space that no walk of the workspace can see:
    the walk's 1 GiB bound never fires, and before the floor an agent could fill the host's disk this way (each
    file up to RLIMIT_FSIZE, as many as it may hold open). The watch also reads the filesystem's free space, which a sandbox
    cannot hide: here the floor is set above the disk's free space, so writing past the margin kills it."""
    monkeypatch.setattr(write_watch, "DISK_DROP_MARGIN", 32 * 2**20)
    ws = _ws(tmp_path)
    box = AgentSandbox(limits=replace(AGENT_LIMITS, max_written_bytes=2**30, min_free_disk_bytes=2**62))
    hide = ("import os, time\n"
            "fds = []\n"
            "for i in range(24):\n"
            "    fd = os.open(f'h{i}', os.O_CREAT | os.O_WRONLY, 0o600); os.unlink(f'h{i}'); fds.append(fd)\n"
            "    for _ in range(8): os.write(fd, os.urandom(2**20))\n"
            "    os.fsync(fd)\n"
            "print('HIDDEN', len(os.listdir('.')), flush=True)\n"
            "time.sleep(20)\n"
            "print('SURVIVED', flush=True)\n")
    (ws.root / "hide.py").write_text(hide)
    t0 = time.monotonic()
    done = run_shell("python3 hide.py", ws.root, 60, box)
    assert time.monotonic() - t0 < 15, done.render(60)
    assert done.limit_note and "host disk" in done.limit_note, done.render(60)
    assert "SURVIVED" not in done.output


def test_a_free_space_floor_needs_both_the_floor_and_a_drop_since_the_start():
    """A host already under a floor still lets a sandbox write up to the margin; a drop on a roomy disk is the
    walk's business, not the floor's. Inodes alike, with the entry bound as their margin."""
    limits = replace(AGENT_LIMITS, min_free_disk_bytes=10 * 2**30, min_free_disk_inodes=10**6,
                     max_written_entries=1000)
    gib, margin = 2**30, write_watch.DISK_DROP_MARGIN

    def below(start_bytes, now_bytes, start_inodes=None, now_inodes=None):
        return write_watch.disk_below_floor({1: write_watch.Free(start_bytes, start_inodes)},
                                            {1: write_watch.Free(now_bytes, now_inodes)}, limits)
    assert "GiB free" in below(20 * gib, 5 * gib)                  # fell under the floor
    assert not below(40 * gib, 20 * gib)                           # 20 GiB written, still roomy
    assert not below(gib, gib - margin)                            # under from the start, within the margin
    assert "MiB written" in below(gib, gib - margin - 1)
    assert not write_watch.disk_below_floor({}, {1: write_watch.Free(0, 0)}, limits)  # not there at the start
    assert "free inodes" in below(20 * gib, 20 * gib, 2 * 10**6, 10**6 - 1)
    assert not below(20 * gib, 20 * gib, 3 * 10**6, 2 * 10**6)     # a million taken, still roomy
    assert not below(20 * gib, 20 * gib, 5000, 4000)               # under from the start, within the margin
    assert below(20 * gib, 20 * gib, 5000, 3999)
    assert not below(20 * gib, 20 * gib, None, None)               # a filesystem that counts no inodes


def test_a_watched_log_replaced_by_a_link_is_measured_where_it_lies(tmp_path):
    """An engine may replace its watched stderr log with a link to another filesystem (/proc: no free space at
    all); the floors read the filesystem holding the link, never the one it points to."""
    (tmp_path / "stderr.log").symlink_to("/proc/self")
    free = write_watch.free_space([str(tmp_path / "stderr.log")])
    assert list(free) == [os.stat(tmp_path).st_dev] != [os.stat("/proc/self").st_dev]


def test_inodes_without_a_name_are_stopped_by_the_inode_floor(tmp_path):
    """Empty files unlinked while open take an inode each and no byte, under no name: as many as the open-file
    limit allows a process, and many processes. The inode floor (set above the disk's free inodes here) stops
    the sandbox once it has taken more inodes than its entry bound."""
    ws = _ws(tmp_path)
    box = AgentSandbox(limits=replace(AGENT_LIMITS, max_written_entries=2000, min_free_disk_inodes=2**62))
    (ws.root / "hide.py").write_text(
        "import os, time\nfds = []\n"
        "for i in range(8000):\n"
        "    fds.append(os.open(f'i{i}', os.O_CREAT | os.O_WRONLY, 0o600)); os.unlink(f'i{i}')\n"
        "print('HIDDEN', len(fds), flush=True)\ntime.sleep(20)\nprint('SURVIVED', flush=True)\n")
    if os.statvfs(ws.root).f_files == 0:
        pytest.skip("this filesystem counts no inodes, so none can run out")
    t0 = time.monotonic()
    done = run_shell("python3 hide.py", ws.root, 60, box)
    assert time.monotonic() - t0 < 15, done.render(60)
    assert done.limit_note and "free inodes" in done.limit_note, done.render(60)
    assert "SURVIVED" not in done.output


def test_a_sparse_flood_is_refused_before_any_content_scan(tmp_path, monkeypatch):
    """2,000 sparse files of 64 MiB (125 GiB to read, seconds of key search each) left for finish_workspace: the
    workspace is refused on its metadata alone, in seconds, and nothing of it is left for the secret scan, the
    hash or the diff to read. The session fails with a clear reason."""
    ws = _ws(tmp_path)
    junk = ws.root / "engine" / "junk"
    junk.mkdir()
    for i in range(2000):
        with open(junk / f"f{i}", "wb") as f:
            f.truncate(SPARSE)
    (junk / "leak.py").write_text(f"k = {KEY!r}\n")
    real_scan = agent_mod.scan_secrets

    def scan(tree, secrets=None, skip=()):  # the flood must be gone before any content scan starts
        assert not junk.exists(), "the secret scan was handed the sparse flood"
        return real_scan(tree, secrets, skip=skip)
    monkeypatch.setattr(agent_mod, "scan_secrets", scan)
    t0 = time.monotonic()
    rejected = finish_workspace(ws, Redactor(secrets=[KEY]))
    assert time.monotonic() - t0 < 10
    assert rejected and "refused" in rejected and "sparse" in rejected, rejected
    assert not junk.exists() and os.listdir(ws.root) == []  # removed unread: nothing of it is trusted
    tree_hash(ws.root)  # the later readers have nothing to read
    # The session's diff says it was refused, not that the agent deleted every file of the engine.
    assert "-import" in ws.diff()
    recorded = _diff_or_reason(ws, (rejected,))
    assert recorded.startswith("# no diff: the workspace is empty.") and "sparse" in recorded
    assert "import" not in recorded


def test_keys_are_still_found_and_blanked_and_the_scan_has_a_total_budget(tmp_path, monkeypatch):
    ws = _ws(tmp_path)
    (ws.root / "engine" / "leak.py").write_text(f"k = {KEY!r}\n")
    rejected = finish_workspace(ws, Redactor(secrets=[KEY]))
    assert rejected and "engine/leak.py: held an API key" in rejected
    assert KEY not in (ws.root / "engine" / "leak.py").read_text()
    # past the total budget, files are reported unscanned (the tree is not clean), never read
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text(f"k = {KEY!r}\n")
    for i in range(5):
        (tree / f"b{i}.txt").write_text("x" * 1000)
    monkeypatch.setattr(secrets_mod, "MAX_SCAN_TOTAL_BYTES", 2500)
    found = find_secrets(tree, [KEY])
    assert found[0].startswith("a.py: secret #1")
    assert sum("not scanned" in line for line in found) >= 3, found


# --- harness-laid material ----------------------------------------------------------------------------------------

def _peer_tree(tmp_path: Path, files: int) -> Path:
    peer = tmp_path / "peer"
    copy_tree(ENGINE_TEMPLATE, peer)
    (peer / "engine" / "many").mkdir()
    for i in range(files):
        (peer / "engine" / "many" / f"f{i}.py").write_text("")
    return peer


def test_a_peers_tree_near_the_bounds_counts_against_no_other_chains_limits(tmp_path, monkeypatch):
    """At a sync, other chains' retained trees are laid out read-only under peers/. Counted as the session's own
    writing, one chain that retained a tree just under the entry bound had every other chain's agent killed by the
    write watch, and its workspace refused and emptied by the cleanup. What the harness laid out, and the agent
    cannot write, counts for neither (known by device and inode, not by name); a peers/ the agent makes where none
    was laid out is its own, and counts in every later call and in the cleanup."""
    monkeypatch.setattr(confine_mod, "MAX_TREE_ENTRIES", 2000)
    box = AgentSandbox(limits=replace(AGENT_LIMITS, max_written_entries=2000))
    ws = prepare_workspace(ENGINE_TEMPLATE, tmp_path / "sync" / "workspace", [],
                           [PeerMaterial("c1", _peer_tree(tmp_path, 2500), ())])
    done = run_shell("sleep 2.5; echo 'x = 1' > engine/mine.py; echo DONE", ws.root, 30, box, laid_out=ws.laid_out)
    assert "DONE" in done.output and done.limit_note is None, done.render(30)
    assert finish_workspace(ws, Redactor()) is None
    assert (ws.root / "engine" / "mine.py").is_file()
    assert len(os.listdir(ws.root / "peers" / "c1" / "engine" / "many")) == 2500
    # the agent's own peers/: written in one call, still counted in the next, and by the cleanup
    ws = _ws(tmp_path / "alone")
    made = run_shell("mkdir -p peers/x && for i in $(seq 1500); do : > peers/x/f$i; done; echo MADE", ws.root, 60, box,
                     laid_out=ws.laid_out)
    assert "MADE" in made.output and made.limit_note is None, made.render(60)
    more = run_shell("mkdir more && for i in $(seq 1000); do : > more/f$i; done; sleep 3; echo ALL-MADE", ws.root, 60,
                     box, laid_out=ws.laid_out)
    assert more.limit_note and "more than 2,000 entries" in more.limit_note, more.render(60)
    assert "ALL-MADE" not in more.output
    rejected = finish_workspace(ws, Redactor())
    assert rejected and "more than 2,000 entries" in rejected, rejected



def test_a_peers_tree_as_deep_as_a_tree_may_be_starts_every_other_chains_sandbox(tmp_path):
    """A retained tree may nest directories as deep as the tree walks take (MAX_DEPTH in all); laid out under
    peers/<chain>/ it lies two levels deeper. The chown of the writable workspace before each sandbox walked into it
    and found it too deep, so no other chain's agent sandbox started at a sync. What the harness laid out read-only
    is not the agent's: it is neither walked nor given away, and stays the host's."""
    peer = tmp_path / "peer"
    copy_tree(ENGINE_TEMPLATE, peer)
    chain(peer / "engine" / "deep", MAX_DEPTH - 3)  # engine/deep/d/.../d: MAX_DEPTH - 1 directories below the root
    tree_hash(peer)  # a tree every walk takes
    ws = prepare_workspace(ENGINE_TEMPLATE, tmp_path / "sync" / "workspace", [Report("c0", 0, "## R\n", "retained")],
                           [PeerMaterial("c1", peer, ())])
    done = run_shell("echo STARTED", ws.root, 30, AgentSandbox(), laid_out=ws.laid_out)
    assert "STARTED" in done.output, done.render(30)
    for d in ws.laid_out:
        assert os.stat(d).st_uid == os.getuid() and os.stat(next(d.iterdir())).st_uid == os.getuid()

# --- deep chains -------------------------------------------------------------------------------------------------

PLANT = """
import os, sys
fd = os.open("engine", os.O_RDONLY)
for _ in range(int(sys.argv[1])):
    os.mkdir("a", dir_fd=fd)
    child = os.open("a", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = child
for where in (fd, os.open("engine", os.O_RDONLY)):
    with open(os.open("suid", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=where), "w") as f:
        f.write("x")
    os.chmod("suid", 0o4777, dir_fd=where)
    os.mkfifo("fifo", dir_fd=where)
    os.mkdir("open", dir_fd=where)
    os.chmod("open", 0o1777, dir_fd=where)
    os.symlink("/etc/passwd", "link", dir_fd=where)
print("PLANTED")
"""


def test_a_chain_deeper_than_the_recursion_limit_is_cut_and_the_rest_sanitized(tmp_path):
    """The agent nests 1,500 directories (setuid file, FIFO, world-writable dir and link at the bottom, the same
    at the top): finish_workspace completes without a RecursionError, the part past MAX_DEPTH is removed and
    reported, and no setuid, world-writable, FIFO or link entry is left anywhere."""
    ws = _ws(tmp_path)
    (ws.root / "plant.py").write_text(PLANT)
    done = run_shell("python3 plant.py 1500 && rm plant.py", ws.root, 60, AgentSandbox())
    assert "PLANTED" in done.output, done.output
    rejected = finish_workspace(ws, Redactor())
    assert rejected and f"more than {MAX_DEPTH} directories deep" in rejected, rejected
    for rel, st in _walk_lstat(ws.root):
        assert rel.count("/") < MAX_DEPTH + 1, rel[:80]
        assert stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode), rel
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH), (rel, oct(st.st_mode))
    assert (ws.root / "engine" / "suid").is_file() and not (ws.root / "engine" / "fifo").exists()
    tree_hash(ws.root)  # a walk of the tree no longer meets the chain
    assert sanitize_workspace(ws.root) == []


def test_deep_chains_raise_no_recursion_error_in_the_scan_the_tools_or_the_report(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    chain(tree, DEEP, name="a")
    found = find_secrets(tree, [KEY])
    assert found == [f"{'a/' * (MAX_DEPTH - 1)}a: more than {MAX_DEPTH} directories deep (not scanned)"], found
    box = Toolbox(tree)
    for name, args in (("list_files", {}), ("search", {"pattern": "x"})):
        out = box.call(name, args)
        assert not out.is_error and "directories deep, not entered" in out.text, (name, out.text[:300])
    # a cli agent's report "file" made a 1,500-deep directory: read as no report, and removed
    report = tmp_path / "SESSION_REPORT.md"
    report.mkdir()
    chain(report, DEEP)
    assert _read_report(report) == "" and not report.exists()


# --- the search tool ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("glob", ["../../../etc/passwd", "../../../**/*", "engine/../../*", "/etc/*",
                                  "*/../../../../usr/**/*"])
def test_search_refuses_globs_that_leave_the_workspace(tmp_path, glob):
    ws = _ws(tmp_path)
    t0 = time.monotonic()
    out = Toolbox(ws.root).call("search", {"pattern": "root", "glob": glob})
    assert out.is_error and "refused" in out.text and "root:" not in out.text, out.text
    assert time.monotonic() - t0 < 2


def test_search_globs_still_work_and_a_walk_is_bounded(tmp_path, monkeypatch):
    ws = _ws(tmp_path)
    (ws.root / "engine" / "sub").mkdir()
    (ws.root / "engine" / "sub" / "needle.py").write_text("needle = 1\n")
    (ws.root / "engine" / "needle.txt").write_text("needle\n")
    box = Toolbox(ws.root)
    for glob, hits in (("*.py", ["engine/sub/needle.py:1: needle = 1"]),
                       ("sub/*.py", ["engine/sub/needle.py:1: needle = 1"]),
                       ("**/*.txt", ["engine/needle.txt:1: needle"]), (None, None)):
        out = box.call("search", {"pattern": "needle", **({"glob": glob} if glob else {})})
        assert not out.is_error, out.text
        if hits is not None:
            assert out.text.splitlines() == hits, (glob, out.text)
        else:
            assert {"engine/sub/needle.py:1: needle = 1", "engine/needle.txt:1: needle"} <= set(out.text.splitlines())
    flood = ws.root / "engine" / "flood"
    flood.mkdir()
    for i in range(300):
        (flood / f"e{i}").mkdir()
    monkeypatch.setattr(tools_mod, "MAX_VISIT", 100)
    for name, args in (("list_files", {}), ("search", {"pattern": "zzz-no-such"})):
        out = box.call(name, args)
        assert not out.is_error and "stopped after looking at 100 entries" in out.text, (name, out.text[-300:])


def test_file_names_with_bidi_or_zero_width_characters_are_removed(tmp_path):
    """A name that shows as another (U+202E reverses what follows it; a zero-width space hides in a look-alike)
    never reaches a diff, a report or the store; a name in another script stays."""
    ws = _ws(tmp_path)
    for name in ("exploit\u202eyp.txt", "model\u200b.py", "modèle_量.py"):
        (ws.root / "engine" / name).write_text("x = 1\n")
    problems = sanitize_workspace(ws.root)
    assert len(problems) == 2 and all("control characters" in p and "\\u20" in p for p in problems), problems
    left = {p.name for p in (ws.root / "engine").iterdir()}
    assert "modèle_量.py" in left and not left & {"exploit\u202eyp.txt", "model\u200b.py"}


@pytest.mark.parametrize("kind", ["link to a host file", "FIFO", "regular file"])
def test_a_cli_agents_report_is_read_only_from_a_regular_file_and_removed(kind, tmp_path):
    """The report a cli agent leaves is read by the host: a link is not followed (it would read a host file), a
    FIFO is not waited on (nobody writes it: the host would block for ever); either is no report. All are removed."""
    host = tmp_path / "host.env"
    host.write_text(f"KEY={KEY}\n")
    report = tmp_path / "SESSION_REPORT.md"
    if kind == "link to a host file":
        report.symlink_to(host)
    elif kind == "FIFO":
        os.mkfifo(report)
    else:
        report.write_text("## Done\n")
    assert _read_report(report) == ("## Done\n" if kind == "regular file" else "")
    assert not os.path.lexists(report) and host.read_text() == f"KEY={KEY}\n"


# --- paths longer than the kernel takes ---------------------------------------------------------------------------

LONG = "n" * 250  # 17 of these nested: over 4,096 bytes, a path no host call can take whole


def test_a_path_past_path_max_is_removed_and_no_host_step_raises(tmp_path):
    """The agent nests 17 directories of 250-character names (made relative to each level, as a shell's mkdir and
    cd would): the session is rejected with the reason instead of the host raising ENAMETOOLONG, nothing longer
    than MAX_PATH_BYTES is left, and the hash and the diff of what is left work."""
    ws = _ws(tmp_path)
    chain(ws.root / "engine", 17, name=LONG)
    rejected = finish_workspace(ws, Redactor(secrets=[KEY]))
    assert rejected and f"a path longer than {MAX_PATH_BYTES} bytes (removed)" in rejected, rejected
    for rel, _ in _walk_lstat(ws.root):
        assert len(rel.encode()) <= MAX_PATH_BYTES, rel[:80]
    tree_hash(ws.root)
    assert _diff_or_reason(ws) == ""  # what is left of the chain is directories, no file


def test_every_tree_walk_refuses_a_path_past_the_cap_as_a_tree_error(tmp_path):
    """A stored or gated tree is walked without a sanitize before it: a long path there is a TreeError (which the
    store and the gate report), not an OSError from a copy whose destination the kernel cannot name."""
    tree = tmp_path / "tree"
    copy_tree(ENGINE_TEMPLATE, tree)
    chain(tree / "engine", 17, name=LONG)
    for step in (lambda: tree_hash(tree), lambda: copy_tree(tree, tmp_path / "copy")):
        with pytest.raises(TreeError, match=f"longer than {MAX_PATH_BYTES} bytes"):
            step()
