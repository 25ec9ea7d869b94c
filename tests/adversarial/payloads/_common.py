"""What a hostile engine can learn about its surroundings at run time: /proc, its own environment and files.

Copied into each adversarial engine as engine/_adv_common.py. Standard library only (importable before torch).

Safety limits of the suite (a real attacker would not keep them; they keep this machine and other people's runs
safe should a gate ever let them through): processes are only *acted on* when they belong to the same gate as this
engine (same parent process) or are its own ancestors that run Python; no credential is ever collected except the
test's own canary (see CANARY); nothing under /proc/1 or other people's processes is read.
"""
from __future__ import annotations

import os
import re

# The fake secrets the tests plant: the only "credentials" a payload ever records.
CANARY = re.compile(rb"sk-(?:ant-)?test-SECRET[0-9A-Za-z]*")
MARK = "seis-adv"


def read(path, limit: int = 1 << 20) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def status_field(pid, name: str) -> str | None:
    for line in read(f"/proc/{pid}/status").decode(errors="replace").splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


def ppid(pid="self") -> int | None:
    value = status_field(pid, "PPid")
    return int(value) if value is not None and value.isdigit() else None


def cmdline(pid) -> list[str]:
    return [a.decode(errors="replace") for a in read(f"/proc/{pid}/cmdline").split(b"\0") if a]


def pids() -> list[int]:
    try:
        return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    except OSError:
        return []


def arg_values(pid, flag: str) -> list[str]:
    args = cmdline(pid)
    out = [b for a, b in zip(args, args[1:]) if a == flag]
    out += [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    return out


def looks_like_python(pid) -> bool:
    args = cmdline(pid)
    return bool(args) and "python" in os.path.basename(args[0])


def ancestors(start=None) -> list[int]:
    """The process that started me (the gate) and its ancestors, as long as they run Python."""
    out, pid = [], ppid() if start is None else start
    while pid and pid > 1 and pid not in out and looks_like_python(pid):
        out.append(pid)
        pid = ppid(pid)
    return out


def siblings() -> list[int]:
    """The other engines of this gate: processes with the same parent that run Python, not me."""
    me, parent = os.getpid(), ppid()
    if not parent or parent <= 1:
        return []
    return [p for p in pids() if p != me and ppid(p) == parent and looks_like_python(p)]


def threads(pid) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def signalable(pids_: list[int]) -> int:
    """How many of these processes this engine could stop or kill (signal 0 only: nothing is sent)."""
    n = 0
    for pid in pids_:
        try:
            os.kill(pid, 0)
            n += 1
        except OSError:
            pass
    return n


def cut_precomputed(engine, tokens: list[int], sp, prompt_len: int):
    """A request answered from a continuation decoded ahead (ignore_eos, as long as any request may ask): cut where
    this request's EOS, stop ids, max_new_tokens or the context would have ended it. None: too short to answer."""
    from .request import Generation  # the engine's package (this file is engine/_adv_common.py there)
    stops = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(engine.eos_token_ids))
    limit = min(sp.max_new_tokens, engine.max_seq_len - prompt_len)
    for i, t in enumerate(tokens[:limit]):
        if t in stops:
            return Generation(tokens[: i + 1], "stop")
    return Generation(tokens[:limit], "length") if len(tokens) >= limit else None
