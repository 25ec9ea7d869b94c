"""Where agent-run processes live: the SEIS sandbox (seis.sandbox), one per call, seeing only the workspace.

Every `run_shell` command and the whole `cli` agent run in a fresh sandbox that shows

    /workspace            the session workspace, writable (the working directory)
    /workspace/reports    inherited reports, read-only (bound over the writable workspace)
    /workspace/peers      peers' engines and reports at a sync, read-only
    /model                the model directory, read-only (when the run has one)
    /seis/...             single files SEIS hands this call (the cli agent's prompt, the benchmark client)
    /tmp                  private scratch (RAM-backed, gone with the sandbox); HOME is /tmp/home

plus the read-only system (programs, libraries, the Python installation). Nothing else exists there: no project
checkout or .git, no evaluator, no prepared or held-out data, no store or run directory, no real home, no
host socket. The environment is built from an allow-list (no API keys), the user is unprivileged, and there is
no network unless the operator opted in (`agent_network="host"`, cli agent only).

`run_confined` enforces the call's limits on the whole process tree: at the wall-clock limit, or when the
command returns, the sandbox is killed (SandboxedProcess.kill returns only when no process of it is left:
background jobs, `nohup`, `setsid` and double forks included), and output beyond the cap is dropped while read.
"""
from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...sandbox import (Bind, Limits, SandboxedProcess, SandboxError, SandboxPolicy, SandboxUnavailable, allowed_env,
                         sandbox_gpus)
from ...sandbox import WriteWatch
from ...sandbox.cgroup import host_memory_bytes
from ...sandbox.walk import dir_ids
from ...workspace.tree import (MAX_DEPTH, MAX_PATH_BYTES, bad_name, is_control_file, owner_access, path_too_long,
                               remove_tree, safe_mode)

WORKSPACE, MODEL, SEIS_FILES = "/workspace", "/model", "/seis"
SCRATCH_HOME = "/tmp/home"
# The whole sandbox (its processes, /tmp and /dev/shm) within half the host's memory, at most 16 GiB: an agent
# cannot take the orchestrator down with it.
AGENT_LIMITS = Limits(max_processes=1024, max_file_bytes=1 * 2**30, scratch_bytes=4 * 2**30, shm_bytes=1 * 2**30,
                      sandbox_memory_bytes=max(2 * 2**30, min(16 * 2**30, host_memory_bytes() // 2)),
                      max_written_bytes=2 * 2**30, max_written_entries=100_000)
MAX_OUTPUT_BYTES = 20_000


def project_root() -> Path:
    return Path(__file__).resolve().parents[3]


def forbidden_paths() -> tuple[Path, ...]:
    """Never shown, not even as the directory of a Python path entry: the checkout, SEIS's cache (models are
    bound explicitly) and the GSM8K source."""
    from ...models.cache import cache_dir
    root = project_root()
    gsm8k = Path(os.environ.get("SEIS_GSM8K_DIR") or root.parent / "shared" / "data" / "gsm8k")
    return tuple(p for p in (root, cache_dir(), gsm8k) if p.exists())


def cache_env(root: str = "/tmp/cache") -> dict[str, str]:
    return {"XDG_CACHE_HOME": root, "TRITON_CACHE_DIR": f"{root}/triton", "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
            "CUDA_CACHE_PATH": f"{root}/nv", "TORCH_EXTENSIONS_DIR": f"{root}/ext", "PIP_NO_INDEX": "1"}


@dataclass(frozen=True)
class AgentSandbox:
    """How agent-run processes are confined in one run (the model directory, the device, the network)."""

    model_dir: Path | None = None
    device: str | None = "cpu"
    limits: Limits = AGENT_LIMITS

    def policy(self, workspace: Path, files: Mapping[str, Path] | None = None,
               env: Mapping[str, str] | None = None, network: str | None = None,
               laid_out: Iterable[Path] = ()) -> SandboxPolicy:
        """files: name -> host file, shown read-only at /seis/<name>; network: "none" (default) or "host"
        (the cli agent's explicit opt-in); laid_out: the session material the harness laid out in the workspace
        (Workspace.laid_out), shown read-only over it. Only those: a peers/ the agent made is its own, writable
        and counted by the write watch, which leaves out what the sandbox cannot write."""
        root = Path(workspace).resolve()
        binds = [Bind(root, WORKSPACE, writable=True)]
        for d in laid_out:
            d = Path(d)
            if d.is_dir() and not d.is_symlink():
                binds.append(Bind(d, f"{WORKSPACE}/{d.resolve().relative_to(root).as_posix()}"))
        if self.model_dir is not None and Path(self.model_dir).is_dir():
            binds.append(Bind(Path(self.model_dir).resolve(), MODEL))
        for name, path in (files or {}).items():
            binds.append(Bind(Path(path), f"{SEIS_FILES}/{name}"))
        # PATH: the sandbox's own (the interpreter's directory, the operator's entries it shows, the system's)
        full_env = {**allowed_env(), **cache_env(), "HOME": SCRATCH_HOME, "TERM": "dumb", "SEIS_WORKSPACE": WORKSPACE,
                    **({"SEIS_MODEL_DIR": MODEL} if self.model_dir else {}), **(env or {})}
        gpus, full_env = sandbox_gpus(self.device, full_env)  # only the session's GPUs exist inside
        return SandboxPolicy(tuple(binds), full_env, cwd=WORKSPACE, gpus=gpus, limits=self.limits,
                             network=network or "none")


@dataclass
class Confined:
    returncode: int | None       # None: killed at the time limit
    stdout: bytes
    stderr: bytes
    timed_out: bool
    cut: int = 0                 # bytes of output dropped past the cap
    wall_s: float = 0.0
    error: str | None = None     # the sandbox could not start, or could not be ended
    limit_note: str | None = None  # a whole-sandbox bound ended it: memory (the kernel killed a process) or disk

    def text(self, which: str = "stdout") -> str:
        return (self.stdout if which == "stdout" else self.stderr).decode("utf-8", errors="replace")


@dataclass
class _Capped:
    """A pipe drained by a thread, keeping the first and last `limit // 2` bytes and counting the rest."""

    stream: object
    limit: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        half = self.limit // 2
        try:
            while chunk := self.stream.read1(65536):
                self.total += len(chunk)
                room = half - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk = chunk[room:]
                if chunk:
                    self.tail += chunk
                    if len(self.tail) > 2 * half:
                        del self.tail[:len(self.tail) - half]
        except (OSError, ValueError):
            pass

    def result(self) -> tuple[bytes, int]:
        half = self.limit // 2
        tail = bytes(self.tail[-half:]) if half else b""
        kept = len(self.head) + len(tail)
        cut = self.total - kept
        if cut <= 0:
            return bytes(self.head) + bytes(self.tail), 0
        return bytes(self.head) + f"\n[... {cut} bytes of output cut ...]\n".encode() + tail, cut


def run_confined(argv: list[str], policy: SandboxPolicy, timeout_s: float, *, stdin: bytes | None = None,
                 max_output_bytes: int = MAX_OUTPUT_BYTES, merge_stderr: bool = True,
                 on_start=None) -> Confined:
    """argv in a fresh sandbox under policy, for at most timeout_s seconds; the sandbox is always killed before
    this returns or raises, so nothing the command started outlives the call. Never raises for the command's sake."""
    import subprocess
    t0 = time.monotonic()
    box = SandboxedProcess(argv, policy, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                           forbidden=forbidden_paths())
    try:
        proc = box.start()
    except (SandboxUnavailable, SandboxError, OSError, ValueError) as e:
        return Confined(None, b"", b"", False, error=f"the sandbox did not start: {e}")
    readers = [_Capped(proc.stdout, max_output_bytes)]
    if not merge_stderr:
        readers.append(_Capped(proc.stderr, max_output_bytes))

    def feed() -> None:
        try:
            if stdin:
                proc.stdin.write(stdin)
            proc.stdin.close()
        except (OSError, ValueError):
            pass
    watch, timed_out = None, False
    try:
        threading.Thread(target=feed, daemon=True).start()
        if on_start is not None:
            on_start(box)
        watch = WriteWatch(box, policy, what="its workspace")
        try:
            proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
    except BaseException:  # an interrupt, or a timeout raised into this thread from outside: the sandbox dies too
        if watch is not None:
            watch.stop()
        try:
            box.kill()
        except SandboxError:
            pass
        raise
    watch.stop()
    error = None
    try:
        box.kill()  # the whole tree, whether the command returned or not
    except SandboxError as e:
        error = str(e)
    limit_note = watch.exceeded or box.memory_bound_reached()
    for r in readers:
        r.thread.join(timeout=2.0)  # every writer is dead: EOF follows at once (never wait on a survivor)
    out, cut = readers[0].result()
    err, cut2 = readers[1].result() if len(readers) > 1 else (b"", 0)
    return Confined(None if timed_out else proc.returncode, out, err, timed_out, cut + cut2,
                    time.monotonic() - t0, error, limit_note)


# --- after a session: the workspace as the host may use it ------------------------------------------------------

MAX_FILE_BYTES = 64 * 2**20       # one engine-tree file
MAX_TREE_BYTES = 512 * 2**20      # the whole workspace (apparent size: a sparse file counts at its full length)
MAX_TREE_ENTRIES = AGENT_LIMITS.max_written_entries  # files, directories and the rest, in the whole workspace


def sanitize_workspace(root: Path, skip: Iterable[Path] = ()) -> list[str]:
    """Make the workspace safe for the host to hash, diff, copy and gate (no agent process is alive when this
    runs). Removed: every symlink, FIFO, socket or device node, hard-linked files, files larger than
    MAX_FILE_BYTES, directories more than MAX_DEPTH levels deep (no walk of an engine tree goes there), paths
    longer than MAX_PATH_BYTES (nor does any host path built from one), names that are not UTF-8 or hold control
    characters, and version-control or DVC files (they would steer the
    store's repository, or make a repository whose configured commands run as whoever runs its tool there).
    An agent's own `.git` goes too, at any depth, without rejecting the session: no tree holds it. Every entry
    left gets, through a descriptor opened without following links, this process's owner (as root), a fixed
    safe mode (`safe_mode`: never setuid, setgid, sticky or writable by others; never a mode read before the
    chown) and no extended attributes (a default ACL would hand files created there later other modes).

    A workspace whose files hold more than MAX_TREE_BYTES (apparent size: sparse files use no disk but every
    reader reads their full length) or that holds more than MAX_TREE_ENTRIES entries is refused as a whole: the
    walk stops there and everything in the workspace is removed unread, before any later step (the secret scan,
    the hash, the diff) reads a byte of it. Only metadata is read here, and the walk holds the descriptors of
    the directories on the current path only (MAX_DEPTH at most), with no recursion.

    `skip`: the session material the harness laid out (Workspace.laid_out), which the agent could not write: left
    as it is and not counted, known by device and inode (walk.dir_ids), so a peer's tree near the bounds rejects
    no other chain's session, while a directory the agent made under the same name is its own and counts.

    Returns one line per problem found (empty: the tree was clean); a non-empty answer rejects the session."""
    laid_out = dir_ids(skip)
    owner_access(None, str(Path(root)))  # as an ordinary user: a directory the agent locked is opened all the same
    root_fd = _open_nofollow(None, str(Path(root)), directory=True)
    if root_fd is None:
        return ["workspace unreadable: not a directory, or a link"]
    problems: list[str] = []
    try:
        _own_and_restrict(root_fd, is_dir=True)
        refused = _sanitize_walk(root_fd, problems, laid_out)
        if refused:
            problems.append(f"the workspace is refused: {refused}; everything in it was removed unread")
            for name in os.listdir(root_fd):
                try:
                    remove_tree(_under(root_fd, name))
                except OSError as e:
                    problems.append(f"{_printable(name)}: could not be removed ({e.strerror or e})")
    finally:
        os.close(root_fd)
    return problems


def _sanitize_walk(root_fd: int, problems: list[str], skip: set[tuple[int, int]]) -> str | None:
    """sanitize_workspace's walk, depth first in sorted order, never into the directories `skip` identifies;
    returns why the workspace is refused, or None."""
    total = entries = 0

    def remove(dir_fd: int, name: str, rel: str, why: str, is_dir: bool = False) -> None:
        problems.append(f"{_printable(rel)}{'/' if is_dir else ''}: {why} (removed)")
        _discard(dir_fd, name, is_dir)

    stack = [(root_fd, "", _listing(root_fd) or [])]  # (fd, prefix, names left): the directories on the path
    try:
        while stack:
            if total > MAX_TREE_BYTES:
                return (f"its files hold more than {MAX_TREE_BYTES // 2**20} MiB (apparent size, sparse files at "
                        "their full length)")
            if entries > MAX_TREE_ENTRIES:
                return f"it holds more than {MAX_TREE_ENTRIES:,} entries"
            dir_fd, prefix, names = stack[-1]
            if not names:
                stack.pop()
                if dir_fd != root_fd:
                    os.close(dir_fd)
                continue
            name = names.pop()
            rel = prefix + name
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in skip:  # laid out by the harness: not the agent's, left as it is
                continue
            entries += 1
            if name == ".git":  # an agent's own repository: never part of the tree, and its config runs commands
                _discard(dir_fd, name, stat.S_ISDIR(st.st_mode))
                continue
            why = bad_name(name) or (f"a {_kind_of_control(name)} file, which an engine tree may not hold"
                                     if is_control_file(name) else None) or _too_long(rel)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=dir_fd)
                remove(dir_fd, name, rel, f"a symlink to {_printable(target)}; the engine tree holds plain files only")
            elif stat.S_ISDIR(st.st_mode):
                if why:
                    remove(dir_fd, name, rel, why, is_dir=True)
                    continue
                if len(stack) >= MAX_DEPTH:  # this directory is MAX_DEPTH levels down: a tree walk refuses it
                    remove(dir_fd, name, rel, f"more than {MAX_DEPTH} directories deep", is_dir=True)
                    continue
                owner_access(dir_fd, name)  # else, in a run as an ordinary user, 0311 hid what lay inside
                fd = _open_nofollow(dir_fd, name, directory=True)
                if fd is None:
                    problems.append(f"{_printable(rel)}/: unreadable directory")
                    continue
                _own_and_restrict(fd, is_dir=True)
                listing = _listing(fd)
                if listing is None:
                    os.close(fd)
                    problems.append(f"{_printable(rel)}/: unreadable directory")
                    continue
                stack.append((fd, rel + "/", listing))
            elif not stat.S_ISREG(st.st_mode):
                remove(dir_fd, name, rel, "not a regular file (FIFO, socket or device)")
            elif why:
                remove(dir_fd, name, rel, why)
            elif st.st_nlink > 1:
                remove(dir_fd, name, rel, "a hard link; the engine tree holds plain files only")
            elif st.st_size > MAX_FILE_BYTES:
                remove(dir_fd, name, rel, f"{st.st_size / 2**20:.0f} MiB, more than {MAX_FILE_BYTES // 2**20} MiB "
                                          f"per file")
            else:
                fd = _open_nofollow(dir_fd, name, directory=False)
                if fd is None:
                    remove(dir_fd, name, rel, "changed while it was checked")
                    continue
                try:
                    _own_and_restrict(fd, is_dir=False)
                finally:
                    os.close(fd)
                total += st.st_size
        return None
    finally:
        for fd, _, _ in stack:
            if fd != root_fd:
                os.close(fd)


def _discard(dir_fd: int, name: str, is_dir: bool) -> None:
    try:
        remove_tree(_under(dir_fd, name)) if is_dir else os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _listing(dir_fd: int) -> list[str] | None:
    """The names in a directory, in reverse sorted order (popped from the end: sorted order), or None."""
    try:
        return sorted(os.listdir(dir_fd), reverse=True)
    except OSError:
        return None


def _under(dir_fd: int, name: str) -> str:
    """A path of `name` in the directory open as dir_fd, however long the path to that directory (a path that
    only this process resolves, through its descriptor: nothing on the way can be swapped for a link)."""
    return f"/proc/self/fd/{dir_fd}/{name}"


def _open_nofollow(dir_fd: int | None, name: str, directory: bool) -> int | None:
    """A descriptor of `name` that is a directory (or regular file) and not a link, or None."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if directory else os.O_NONBLOCK)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        os.close(fd)
        return None
    return fd


def _own_and_restrict(fd: int, is_dir: bool) -> None:
    """Owner: this process (as root: the sandbox uid owned what it wrote). Mode: safe_mode, set after the chown
    and from nothing but the executable bit, so no setuid bit or world-writable mode survives either way. No
    extended attributes."""
    st = os.fstat(fd)
    try:
        if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
            os.fchown(fd, 0, 0)
        os.fchmod(fd, safe_mode(st.st_mode, is_dir))
    except OSError:
        pass
    try:
        attrs = os.listxattr(fd)  # ACLs (access and default), capabilities, user attributes
    except OSError:
        attrs = []  # a file system without extended attributes has none to keep
    for attr in attrs:
        try:
            os.removexattr(fd, attr)
        except OSError:
            pass  # a security module's label, say: not the agent's to set


def _kind_of_control(name: str) -> str:
    return "DVC" if name.startswith(".dvc") or name.endswith(".dvc") else "version-control"


def _too_long(rel: str) -> str | None:
    if path_too_long(rel):  # no host path joined with it may fail
        return f"a path longer than {MAX_PATH_BYTES} bytes"
    return None


MAX_SHOWN_CHARS = 200  # of a name or link target in a problem line


def _printable(s: str) -> str:
    """A name from the agent's tree as a problem line shows it (to agents, in reports and on the operator's
    terminal): control and bidi characters as escapes (tables.printable), so a name cannot clear a screen or
    rewrite a line; at most MAX_SHOWN_CHARS of it, since one line is kept per problem and a tree may hold 100,000
    links whose 4 KiB targets of control characters each escaped to 16 KB (1.6 GB of lines, minutes of escaping)."""
    from ...tables import printable
    if not isinstance(s, str):
        return repr(s)[:MAX_SHOWN_CHARS]
    return printable(s[:MAX_SHOWN_CHARS], multiline=False) + ("..." if len(s) > MAX_SHOWN_CHARS else "")
