"""A bound on what a sandbox writes to the host's disk, all files together: per-file limits (RLIMIT_FSIZE) alone
would let it fill the disk with many files. Agents' workspaces and engines' compile caches are watched alike.

Two looks, every second. A walk counts the files under the sandbox's writable directories: it names what grew,
but it sees only what has a name when it passes. A file unlinked while its writer holds it open, or a directory
renamed back and forth while the walk looks, still takes disk space and is not walked. So the watch also reads
the free space of those directories' filesystems, which nothing in a sandbox can hide from."""
from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .policy import Limits, SandboxPolicy
from .process import SandboxedProcess, SandboxError
from .walk import Unreadable, skipping, walk

WATCH_PERIOD_S = 1.0
# How far a filesystem's free space must have fallen since the watch began, besides being under the floor, before
# the watch kills: on a host that starts under the floor, a sandbox may still write this much.
DISK_DROP_MARGIN = 256 * 2**20


class WriteWatch:
    """Kills the sandbox when what it wrote under `roots` (by default its writable binds) grows past
    Limits.max_written_bytes or Limits.max_written_entries. A file counts for the larger of its blocks on disk
    and its apparent size, so sparse files (no disk used, but every host reader reads their full length) count
    too. It also kills it when the free bytes or inodes of a filesystem under `roots` fall under
    Limits.min_free_disk_bytes or Limits.min_free_disk_inodes while it runs (disk_below_floor). Looks every WATCH_PERIOD_S seconds, never
    following a link; a look stops counting once over a limit. What the policy binds read-only inside a writable
    bind (a workspace's reports/ and peers/, which the harness laid out) is not the sandbox's writing and is left
    out, known by device and inode as it was when the watch began. `exceeded` says why it killed the sandbox (None:
    it did not)."""

    def __init__(self, box: SandboxedProcess, policy: SandboxPolicy, extra: Iterable[str | os.PathLike] = (),
                 what: str = "its writable directories"):
        self.box, self.limits, self.what = box, policy.limits, what
        self.roots = [str(b.src) for b in policy.binds if b.writable] + [str(p) for p in extra]
        self._enter = skipping(b.src for b in policy.binds if not b.writable)
        self.exceeded: str | None = None
        self._free_at_start = free_space(self.roots)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if self.roots and self.limits.max_written_bytes is not None:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_PERIOD_S):
            why = (disk_below_floor(self._free_at_start, free_space(self.roots), self.limits)
                   or over_limits(self.roots, self.limits, self.what, self._enter))
            if why:
                self.exceeded = f"the sandbox was killed: {why}"
                try:
                    self.box.kill()
                except SandboxError:
                    pass
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()  # its kill() must be over before the caller kills the sandbox again


def over_limits(roots: list[str], limits: Limits, what: str,
                enter: Callable[[os.DirEntry], bool] | None = None) -> str | None:
    """Why what is under roots (directories, or files such as a log) is past the limits, or None. `enter`: the
    walk's, keeping it out of directories not counted (walk.skipping)."""
    size = entries = 0

    def why() -> str | None:
        if size > limits.max_written_bytes:
            return (f"{what}: more than {limits.max_written_bytes / 2**30:.1f} GiB on disk "
                    "(apparent size of sparse files included)")
        if entries > limits.max_written_entries:
            return f"{what}: more than {limits.max_written_entries:,} entries"
        return None

    for root in roots:
        try:
            st = os.stat(root, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            size += max(st.st_blocks * 512, st.st_size)
            continue
        # No depth cap: a chain of any depth counts in full (it is iterative, and entries are bounded).
        for item in walk(root, max_depth=None, ordered=False, enter=enter):
            if isinstance(item, Unreadable):
                if item.error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ESTALE):
                    continue  # removed or replaced while the watch looked: never followed
                # Past PATH_MAX, say: what lies below would go uncounted.
                return f"{what}: a directory the watch cannot list ({item.error.strerror or item.error})"
            try:  # TooDeep never comes: no cap
                st = item.dir_entry.stat(follow_symlinks=False)
            except OSError:
                continue
            entries += 1
            size += max(st.st_blocks * 512, st.st_size)  # sparse files: their apparent size
            if reason := why():
                return reason
    return why()


@dataclass(frozen=True)
class Free:
    """What a filesystem has left for unprivileged writers; inodes None where it does not count them."""
    bytes: int
    inodes: int | None


def free_space(paths: list[str]) -> dict[int, Free]:
    """What is free on each filesystem (by device number) holding one of paths."""
    free = {}
    for path in paths:
        try:  # the entry itself, never what a link there points to (a sandbox may replace a watched log)
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
        except OSError:
            continue  # gone: nothing of it to watch
        try:
            dev, vfs = os.fstat(fd).st_dev, os.fstatvfs(fd)
        finally:
            os.close(fd)
        free[dev] = Free(vfs.f_bavail * vfs.f_frsize, vfs.f_favail if vfs.f_files else None)
    return free


def disk_below_floor(at_start: dict[int, Free], now: dict[int, Free], limits: Limits) -> str | None:
    """Why a filesystem is past a floor: its free bytes under Limits.min_free_disk_bytes and at least
    DISK_DROP_MARGIN below what they were when the watch began, or its free inodes under
    Limits.min_free_disk_inodes and more than Limits.max_written_entries below. It is the host's disk, which other
    writers share: at a floor every sandbox writing there is stopped, whoever wrote."""
    for dev, free in now.items():
        start = at_start.get(dev)
        if start is None:
            continue
        if free.bytes < limits.min_free_disk_bytes and start.bytes - free.bytes > DISK_DROP_MARGIN:
            return (f"the host disk it writes to fell under {limits.min_free_disk_bytes / 2**30:.1f} GiB free "
                    f"({(start.bytes - free.bytes) / 2**20:,.0f} MiB written since it started, named files or not)")
        if (free.inodes is not None and start.inodes is not None and free.inodes < limits.min_free_disk_inodes
                and start.inodes - free.inodes > limits.max_written_entries):
            return (f"the host disk it writes to fell under {limits.min_free_disk_inodes:,} free inodes "
                    f"({start.inodes - free.inodes:,} taken since it started, named files or not)")
    return None
