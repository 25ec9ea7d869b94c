"""The SDK agents' file tools run in SEIS's own process on a workspace the agent's shell wrote: a FIFO, a link or a
huge file in place of a source file, and a search pattern built to backtrack forever. Each test attacks a tool the
way an agent would and must get an error (or a capped answer) back at once, never a host process that blocks,
reads past its caps or freezes. Tools that could block run in a thread joined with a timeout, and the regex attack
in a child interpreter (a backtracking regex holds the GIL, so no thread of the test could time it out), so that a
regression fails instead of hanging the suite. CPU only, a few seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from seis.agents.llm import tools as tools_mod
from seis.agents.llm.tools import MAX_MATCHES, MAX_READ_CHARS, Toolbox, ToolOutcome

PROJECT = Path(__file__).resolve().parents[1]


def _workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "model.py").write_text("import torch\nneedle = 1\n")
    return root


def _call_guarded(box: Toolbox, name: str, args: dict, fifo: Path | None = None, limit_s: float = 5.0) -> ToolOutcome:
    """box.call in a thread that must return within limit_s. A FIFO the call may be stuck on is opened from this
    side afterwards (read and write, non-blocking), which releases a blocked open, so no thread is left behind."""
    result: list[ToolOutcome] = []
    worker = threading.Thread(target=lambda: result.append(box.call(name, args)), daemon=True)
    worker.start()
    worker.join(limit_s)
    stuck = worker.is_alive()
    if stuck and fifo is not None:
        os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
        worker.join(5)
    assert not stuck, f"{name} {args} blocked the host for more than {limit_s} s"
    return result[0]


# --- a catastrophic search pattern ---------------------------------------------------------------------------------

_REDOS = r"""
import json, os, sys, threading, time
from pathlib import Path
from seis.agents.llm import tools
from seis.agents.llm.tools import Toolbox
root, pattern, limit_s, deadline_s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
tools.SEARCH_TIMEOUT_S = limit_s
box = Toolbox(root, deadline=None if deadline_s == "none" else time.monotonic() + float(deadline_s))
ticks, done = [0], threading.Event()
def tick():  # another session's thread: it must keep running while the search runs
    while not done.is_set():
        ticks[0] += 1
        time.sleep(0.01)
threading.Thread(target=tick, daemon=True).start()
t0 = time.monotonic()
out = box.call("search", {"pattern": pattern})
elapsed = time.monotonic() - t0
done.set()
def parent_of(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
    except OSError:  # gone between the listing and the read: no child of ours
        return None
children = [p for p in os.listdir("/proc") if p.isdigit() and parent_of(p) == str(os.getpid())]
print(json.dumps({"is_error": out.is_error, "text": out.text, "elapsed": elapsed, "ticks": ticks[0],
                  "children": children}))
"""


@pytest.mark.parametrize("pattern", [r"^(a+)+$", r"(a|aa)+$", r"(.*a){20}!x"])
def test_a_catastrophic_search_pattern_is_stopped_in_time_and_the_host_keeps_running(tmp_path, pattern):
    """`^(a+)+$` against 40 a's and a '!' takes 2^40 steps inside re's C code, holding the GIL: before the fix
    the whole host (every chain's session, the engine timeouts) froze. Now the matching runs in a child killed at
    the limit; the tool returns an error, other threads ran meanwhile, and no process is left."""
    out = _redos(tmp_path, pattern, limit_s=2, deadline_s=None)
    assert out["is_error"] and "took longer than 2 s" in out["text"], out["text"]
    assert out["elapsed"] < 10 and out["ticks"] > 50, out
    assert out["children"] == [], out


def test_the_search_limit_is_also_the_sessions_time_left(tmp_path):
    out = _redos(tmp_path, r"^(a+)+$", limit_s=600, deadline_s=3)
    assert out["is_error"] and "took longer than 2." in out["text"], out["text"]
    assert out["elapsed"] < 10 and out["children"] == [], out


def _redos(tmp_path: Path, pattern: str, limit_s: float, deadline_s: float | None) -> dict:
    root = _workspace(tmp_path)
    (root / "engine" / "evil.py").write_text(("a" * 40 + "!\n") * 3)
    try:
        args = [str(root), pattern, str(limit_s), "none" if deadline_s is None else str(deadline_s)]
        done = subprocess.run([sys.executable, "-c", _REDOS, *args], capture_output=True, text=True, timeout=60,
                              cwd=PROJECT)
    except subprocess.TimeoutExpired:
        pytest.fail("the search froze its process: no result after 60 s")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_search_output_is_capped(tmp_path, monkeypatch):
    root = _workspace(tmp_path)
    (root / "engine" / "a_many.py").write_text(("needle " + "x" * 1000 + "\n") * 1000)
    for i in range(5):
        (root / "engine" / f"big{i}.py").write_text("y\n" * 600_000)  # 1.2 MB each
    monkeypatch.setattr(tools_mod, "MAX_SEARCH_FILE_BYTES", 2**20)
    monkeypatch.setattr(tools_mod, "MAX_SEARCH_BYTES", 3 * 2**20)
    out = _call_guarded(Toolbox(root), "search", {"pattern": "needle|zzz"})
    lines = out.text.splitlines()
    assert not out.is_error and len([x for x in lines if x.startswith("engine/a_many.py:")]) == MAX_MATCHES
    assert max(map(len, lines)) < 400 and lines[-1] == f"[... cut at {MAX_MATCHES} matches]", lines[-3:]
    assert "[engine/big0.py: only its first 1 MiB searched]" in lines
    assert "[search stopped after reading 3 MiB; narrow path or glob]" in lines


# --- FIFOs and links in place of files -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,args", [
    ("write_file", {"path": "engine/fifo.py", "content": "x = 1\n"}),
    ("write_file", {"path": "engine/to_fifo.py", "content": "x = 1\n"}),  # a link inside the workspace to it
    ("read_file", {"path": "engine/fifo.py"}),
    ("edit_file", {"path": "engine/fifo.py", "old_string": "x", "new_string": "y"}),
    ("search", {"pattern": "x", "path": "engine/fifo.py"}),
])
def test_a_fifo_in_place_of_a_file_is_an_error_at_once(tmp_path, name, args):
    """`mkfifo engine/fifo.py` in the sandbox, then a file tool on it: before the fix write_file blocked the
    host in open() forever, waiting for a reader that never comes."""
    root = _workspace(tmp_path)
    fifo = root / "engine" / "fifo.py"
    os.mkfifo(fifo)
    (root / "engine" / "to_fifo.py").symlink_to("fifo.py")
    t0 = time.monotonic()
    out = _call_guarded(Toolbox(root), name, args, fifo=fifo)
    assert out.is_error and "FIFO" in out.text and "regular file" in out.text, out.text
    assert time.monotonic() - t0 < 2 and fifo.is_fifo()


def test_search_over_a_tree_skips_fifos_and_links(tmp_path):
    root = _workspace(tmp_path)
    outside = tmp_path / "secret.txt"
    outside.write_text("needle held-out\n")
    os.mkfifo(root / "engine" / "fifo.py")
    (root / "engine" / "leak.py").symlink_to(outside)
    out = _call_guarded(Toolbox(root), "search", {"pattern": "needle"}, fifo=root / "engine" / "fifo.py")
    assert not out.is_error and out.text == "engine/model.py:2: needle = 1", out.text


@pytest.mark.parametrize("name,args", [
    ("read_file", {"path": "engine/model.py"}),
    ("search", {"pattern": "held", "path": "engine/model.py"}),
    ("edit_file", {"path": "engine/model.py", "old_string": "held-out", "new_string": "overwritten"}),
    ("write_file", {"path": "engine/model.py", "content": "overwritten"}),
])
def test_a_link_planted_after_confinement_is_not_followed(tmp_path, monkeypatch, name, args):
    """The path is checked (confine) before it is opened; a link put in its place in between must not be
    followed out of the workspace: the open itself refuses links. Before the fix every tool went through it."""
    root = _workspace(tmp_path)
    outside = tmp_path / "secret.txt"
    outside.write_text("held-out answers\n")
    confine = tools_mod.confine

    def confine_then_swap(*a, **k) -> Path:
        target = confine(*a, **k)
        target.unlink()
        target.symlink_to(outside)
        return target

    monkeypatch.setattr(tools_mod, "confine", confine_then_swap)
    out = _call_guarded(Toolbox(root), name, args)
    assert out.is_error and "symlink" in out.text and "held-out" not in out.text, out.text
    assert outside.read_text() == "held-out answers\n"


@pytest.mark.parametrize("name,args", [
    ("read_file", {"path": "engine/out"}),
    ("edit_file", {"path": "engine/out", "old_string": "held-out", "new_string": "x"}),
    ("write_file", {"path": "engine/out", "content": "x"}),
    ("write_file", {"path": "engine/dangling", "content": "x"}),
    ("search", {"pattern": "held", "path": "engine/out"}),
    ("list_files", {"path": "engine/outdir"}),
])
def test_links_leading_out_are_refused(tmp_path, name, args):
    root = _workspace(tmp_path)
    outside = tmp_path / "secret.txt"
    outside.write_text("held-out answers\n")
    (root / "engine" / "out").symlink_to(outside)
    (root / "engine" / "outdir").symlink_to(tmp_path)
    (root / "engine" / "dangling").symlink_to(tmp_path / "created-outside")
    out = _call_guarded(Toolbox(root), name, args)
    assert out.is_error and "refused" in out.text and "held-out" not in out.text, out.text
    assert outside.read_text() == "held-out answers\n" and not (tmp_path / "created-outside").exists()


# --- huge files ----------------------------------------------------------------------------------------------------

def test_huge_files_are_read_capped(tmp_path):
    root = _workspace(tmp_path)
    with open(root / "engine" / "huge.py", "wb") as f:
        f.truncate(4 * 2**30)  # sparse: 4 GiB that cost no disk
    box = Toolbox(root)
    t0 = time.monotonic()
    read = _call_guarded(box, "read_file", {"path": "engine/huge.py"})
    assert not read.is_error and len(read.text) < MAX_READ_CHARS + 500, len(read.text)
    far = _call_guarded(box, "read_file", {"path": "engine/huge.py", "start_line": 10**9})
    assert "stopped reading after 8 MiB of a 4294967296-byte file" in far.text, far.text
    edit = _call_guarded(box, "edit_file", {"path": "engine/huge.py", "old_string": "a", "new_string": "b"})
    assert edit.is_error and "larger than" in edit.text
    search = _call_guarded(box, "search", {"pattern": "needle"})  # its head is NUL bytes: binary, skipped
    assert search.text == "engine/model.py:2: needle = 1", search.text
    assert time.monotonic() - t0 < 10


def test_no_tool_result_outgrows_its_cap_however_long_the_names_in_the_tree(tmp_path):
    """The agent's shell names a chain of directories with long names down to the depth cap and, at its bottom,
    thousands of directories more: list_files noted each as too deep, with its ~3.5 KB path, one 10 MB answer
    (80 MB at the 20,000 entries a walk looks at), held by the host, redacted, logged and sent to the API every
    turn; search named the 3.5 KB path in each of its 200 hits. Every tool's result is capped whatever the tool."""
    root = _workspace(tmp_path)
    bottom = root / "engine"
    for i in range(62):  # engine is depth 1: the chain ends at depth 63, whose directories are not entered
        bottom = bottom / f"{i:02d}{'d' * 48}"
    bottom.mkdir(parents=True)
    for i in range(3000):
        os.mkdir(bottom / f"{i:05d}{'x' * 195}")
    (bottom.parent / ("f" * 200 + ".py")).write_text("needle\n" * 300)
    box = Toolbox(root)
    for name, args in [("list_files", {}), ("search", {"pattern": "needle"})]:
        out = _call_guarded(box, name, args, limit_s=30)
        assert not out.is_error and len(out.text) <= tools_mod.MAX_RESULT_CHARS + 100, (name, len(out.text))
        assert "characters cut" in out.text, (name, len(out.text))


def test_ordinary_edits_still_work(tmp_path):
    root = _workspace(tmp_path)
    box = Toolbox(root)
    assert not box.call("write_file", {"path": "engine/sub/new.py", "content": "a = 1\nb = 2\n"}).is_error
    assert not box.call("edit_file", {"path": "engine/sub/new.py", "old_string": "b = 2",
                                      "new_string": "b = 3"}).is_error
    assert (root / "engine" / "sub" / "new.py").read_text() == "a = 1\nb = 3\n"
    assert not box.call("write_file", {"path": "engine/sub/new.py", "content": "c"}).is_error
    assert (root / "engine" / "sub" / "new.py").read_text() == "c"
    assert box.call("read_file", {"path": "engine/sub/new.py"}).text == "[engine/sub/new.py: lines 1-1 of 1]\nc"
    assert box.call("search", {"pattern": "("}).is_error
    assert box.call("write_file", {"path": "engine", "content": "x"}).is_error
