"""A memory cgroup around one sandbox: a bound on everything it holds at once (its processes and the pages of its
RAM-backed /tmp and /dev/shm), which per-process rlimits cannot give.

    cage = MemoryCage.create("seis-61000", 6 * 2**30)   # None where this host lets us make no memory cgroup
    argv = [*cage.enter_argv(), *argv]                   # the first process joins it before it execs the rest
    ...; cage.oom_kills(); cage.remove()

cgroup v2 (memory.max) where this process's cgroup offers the memory controller to its children, else the v1
memory hierarchy (memory.limit_in_bytes). The sandbox's user cannot leave it: cgroup.procs files are root's.
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

_MOUNTS = Path("/proc/self/mounts")
_OWN = Path("/proc/self/cgroup")


def _mount_points() -> tuple[Path | None, Path | None]:
    """(the cgroup2 mount, the v1 memory mount) of this host, either None when absent."""
    v2 = v1 = None
    try:
        lines = _MOUNTS.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup2" and v2 is None:
            v2 = Path(parts[1])
        elif parts[2] == "cgroup" and "memory" in parts[3].split(","):
            v1 = Path(parts[1])
    return v2, v1


def _own_cgroups() -> dict[str, str]:
    """controller list ('' for v2) -> this process's cgroup path."""
    out = {}
    try:
        for line in _OWN.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            out[controllers] = path
    except (OSError, ValueError):
        pass
    return out


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class MemoryCage:
    dir: Path
    limit_bytes: int
    version: int  # 1 or 2

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> "MemoryCage | None":
        """A fresh cgroup `name` under this process's own, limited to limit_bytes (swap included where the host
        accounts it); None if neither hierarchy lets this process make one."""
        v2, v1 = _mount_points()
        own = _own_cgroups()
        if v2 is not None and "" in own:
            cage = cls._make(v2 / own[""].lstrip("/") / name, limit_bytes, 2)
            if cage is not None:
                return cage
        v1_path = next((p for c, p in own.items() if "memory" in c.split(",")), None)
        if v1 is not None and v1_path is not None:
            return cls._make(v1 / v1_path.lstrip("/") / name, limit_bytes, 1)
        return None

    @classmethod
    def _make(cls, path: Path, limit_bytes: int, version: int) -> "MemoryCage | None":
        if version == 2 and "memory" not in _read(path.parent / "cgroup.subtree_control").split():
            return None  # the memory controller is not offered to children here
        _remove_dir(path)  # left by a run that was killed before it could clean up
        try:
            path.mkdir()
        except OSError:
            return None
        if version == 2:
            ok = _write(path / "memory.max", str(limit_bytes))
            _write(path / "memory.swap.max", "0")
        else:
            ok = _write(path / "memory.limit_in_bytes", str(limit_bytes))
            _write(path / "memory.memsw.limit_in_bytes", str(limit_bytes))  # absent without swap accounting
        if not ok:
            _remove_dir(path)
            return None
        return cls(path, limit_bytes, version)

    def enter_argv(self) -> list[str]:
        """A prefix that moves the process into the cage, then execs the rest of the command line: everything it
        starts is born inside. If the move fails, nothing runs."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.dir / "cgroup.procs")]

    def oom_kills(self) -> int:
        """How many processes the kernel killed in the cage for want of memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in _read(self.dir / name).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def remove(self) -> None:
        """Remove the cage once its processes are gone (a few retries: the last exits are reaped lazily)."""
        _remove_dir(self.dir)


@functools.cache
def can_cage() -> bool:
    """Whether sandboxes started by this process get a memory cgroup (seis.sandbox.SandboxedProcess makes one as
    root, where a hierarchy lets it): a cage made and removed again tells."""
    if os.geteuid() != 0:
        return False
    cage = MemoryCage.create(f"seis-probe-{os.getpid()}", 2**30)
    if cage is None:
        return False
    cage.remove()
    return True


_VMSTAT = Path("/proc/vmstat")


def host_oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed on this host since boot (None where the
    kernel does not say: older than 4.13, or no /proc). A SIGKILL while this number stands still was not it."""
    for line in _read(_VMSTAT).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _remove_dir(path: Path, tries: int = 50) -> None:
    for _ in range(tries):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
