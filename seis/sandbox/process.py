"""A process tree in its own sandbox: started from a policy, frozen and thawed as a whole, killed as a whole.

Membership is the sandbox's PID namespace: every process the command starts (double forks and `setsid` ones
included) lives in it, and killing the namespace's first process makes the kernel kill all the others. `close`
returns only when no process of the namespace is left, so a caller that has closed its sandboxes knows no
untrusted code is running any more.
"""
from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import pwd
import resource
import signal
import stat
import subprocess
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import bwrap, seccomp
from .cgroup import MemoryCage
from .memory_watch import MemoryWatch
from .policy import MAX_DEPTH, SAFE_PATH, SandboxPolicy
from .walk import dir_ids

UID_BASE, UID_COUNT = 61000, 999     # one host uid per live sandbox (as root), never a real account (_is_account)
# One fixed place for the whole host (not $TMPDIR): every SEIS process must see the same leases, or two could
# hand out the same uid and one would kill the other's "leftovers".
_LOCK_DIR = Path("/run/seis-sandbox-uids") if os.access("/run", os.W_OK) else Path("/tmp/seis-sandbox-uids")
_STARTED: weakref.WeakSet = weakref.WeakSet()   # this process's sandboxes that have started and not been killed
_STARTED_LOCK = threading.RLock()  # re-entrant: the Ctrl-C handler may run while its thread holds it
_INTERRUPTED = threading.Event()                # set once: this process starts no sandbox any more
# freeze(): an engine idle between requests stops within microseconds; one still not stopped after seconds resists
FREEZE_TIMEOUT_S = 5.0
_FREEZE_LOOK_S = 0.001   # between a round's SIGSTOPs and the looks that check them


class SandboxError(RuntimeError):
    """The sandbox could not be started, or a process of it could not be ended."""


def _processes() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _states(pid: int) -> list[bytes]:
    """The state letters (R, S, T, Z, ...) of every thread of the process; empty once it is gone. Threads, not
    just the process: a thread group whose first thread has ended shows Z for the process while its other
    threads run on."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    states = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                states.append(f.read().rsplit(b")", 1)[1].split()[0])
        except (OSError, IndexError):
            pass  # the thread ended meanwhile
    return states


_DEAD = (b"Z", b"X")


def _run_ns(pid: int) -> dict[tuple[int, int], int]:
    """How long each live thread of the process has run, in nanoseconds (schedstat's first field; the thread's
    ticks of CPU time where the kernel keeps no schedstat), by (pid, thread id)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    ran = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] in _DEAD:
                continue
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    ran[(pid, int(tid))] = int(f.read().split()[0])
            except FileNotFoundError:
                ran[(pid, int(tid))] = int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            pass  # the thread ended meanwhile
    return ran


def _alive(pid: int) -> bool:
    """A process with a thread that is not dead. Zombies count as gone: they run nothing, and an orphaned sandbox
    init waits as a zombie until the host's init reaps it."""
    return any(s not in _DEAD for s in _states(pid))


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


_NS_GET_PARENT = 0xB702  # ioctl on a namespace descriptor: a descriptor of its parent (linux/nsfs.h)
_MAX_PID_NS_DEPTH = 32   # the kernel's limit on nested PID namespaces


def _in_pid_ns(pid: int, ns: str) -> bool:
    """Whether pid's PID namespace is `ns` ("pid:[inode]") or nested in it. A process in the sandbox can make
    namespaces of its own (unshare --user --pid), and its children there are still the sandbox's to stop."""
    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        for _ in range(_MAX_PID_NS_DEPTH + 1):
            if f"pid:[{os.fstat(fd).st_ino}]" == ns:
                return True
            try:
                parent = fcntl.ioctl(fd, _NS_GET_PARENT)
            except OSError:  # the host's namespace, which has no parent this process may see
                return False
            os.close(fd)
            fd = parent
        return False
    finally:
        os.close(fd)


def _pidfd(pid: int) -> int | None:
    """A descriptor of the process pid is now (None if it is gone already)."""
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


@functools.lru_cache(maxsize=None)
def _is_account(uid: int) -> bool:
    """Whether `uid` is a user of this host. The lease range lies in Debian's range for accounts that packages
    create (60000-64999): such an account's uid is never leased, and its processes are never a sandbox's leftovers."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _leasable(uid: int) -> bool:
    return UID_BASE <= uid < UID_BASE + UID_COUNT and not _is_account(uid)


class _UidLease:
    """An exclusive host uid for one sandbox: a held flock per uid, released with the lease (or the process)."""

    def __init__(self):
        _LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for uid in filter(_leasable, range(UID_BASE, UID_BASE + UID_COUNT)):
            fd = os.open(_LOCK_DIR / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            try:
                _kill(_leftovers({uid}))  # of a sandbox whose owner was killed before it could clean up
            except BaseException:
                os.close(fd)
                raise
            return
        raise SandboxError(f"all {UID_COUNT} sandbox uids are in use")

    def release(self) -> None:
        os.close(self._fd)


def _sandbox_uid(pid: int) -> int | None:
    """The sandbox uid a process belongs to: its own uid if it is one, else the uid the bwrap command on its
    command line switches to. The launcher runs as root through its stages (the shells that enter the memory
    cgroup and set the OOM score, prlimit, then bwrap) and so does the namespace's init; a launcher stopped or
    stuck before it became bwrap is the sandbox's as much as bwrap is."""
    uid = _uid_of(pid)
    if uid is not None and _leasable(uid):
        return uid
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    if b"bwrap" not in (os.path.basename(a) for a in argv):
        return None
    for arg in argv:
        if arg.startswith(b"--reuid=") and arg[len(b"--reuid="):].isdigit():
            uid = int(arg[len(b"--reuid="):])
            return uid if _leasable(uid) else None
    return None


def _leftovers(uids: set[int]) -> list[int]:
    """What is left of the sandboxes of `uids`. The root-owned bwrap processes count too: when the owner dies while
    bwrap starts, a launcher killed before it lets its child go on leaves that child (the namespace's init, not yet
    bound to its parent's life) waiting for ever."""
    return [pid for pid in _processes() if _sandbox_uid(pid) in uids and _alive(pid)]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def sweep_leftovers() -> int:
    """Kill what is left of every sandbox whose owner is gone (its uid lease is free); returns how many processes.
    For a run's cleanup after its process was killed: nothing else would end them before the uid is leased again."""
    if not _LOCK_DIR.is_dir():
        return 0
    held: dict[int, int] = {}  # the free leases, held while their leftovers are killed
    try:
        for path in _LOCK_DIR.iterdir():
            if not path.name.isdigit() or not _leasable(int(path.name)):
                continue  # an account's uid (leased before it was one) or not a lease
            fd = os.open(path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held[int(path.name)] = fd
            except BlockingIOError:
                os.close(fd)  # a live sandbox's
        left = _leftovers(set(held))
        _kill(left)
        return len(left)
    finally:
        for fd in held.values():
            os.close(fd)


# The kernel's OOM killer picks the process with the most memory, weighted by oom_score_adj: at the maximum, every
# sandboxed process goes before the orchestrator or anything else of the host's, however little it holds. Raising
# it needs no privilege; a sandbox, with no capabilities, cannot lower it again.
OOM_SCORE_ADJ = 1000


def _oom_first_argv() -> list[str]:
    """A prefix that sets the process's oom_score_adj to OOM_SCORE_ADJ, then execs the rest of the command line
    (everything it starts inherits it). If the write fails, nothing runs."""
    return ["sh", "-c", f'echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj && exec "$@"', "sh"]


def _limit_args(policy: SandboxPolicy, caged: bool) -> list[str]:
    """`prlimit` in front of bwrap, so the limits hold for everything started inside. Not a preexec_fn: Python
    code between fork and exec can deadlock in a process with threads, and gates start engines from threads.
    Without a memory cgroup (`caged`), a sandbox without GPUs gets its whole-sandbox bound as RLIMIT_AS per
    process (CUDA reserves far more address space than it uses, so GPU sandboxes cannot)."""
    lim = policy.limits
    wanted = [("nproc", resource.RLIMIT_NPROC, lim.max_processes), ("fsize", resource.RLIMIT_FSIZE,
              lim.max_file_bytes), ("nofile", resource.RLIMIT_NOFILE, lim.open_files), ("core", resource.RLIMIT_CORE, 0)]
    address_space = lim.memory_bytes
    if not caged and lim.sandbox_memory_bytes is not None and policy.gpus == ():
        address_space = min(address_space or lim.sandbox_memory_bytes, lim.sandbox_memory_bytes)
    if address_space is not None:
        wanted.append(("as", resource.RLIMIT_AS, address_space))
    args = ["prlimit"]
    for name, which, value in wanted:  # never above the current hard limit
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        args.append(f"--{name}={value}:{value}")
    return [*args, "--"]


class SandboxedProcess:
    """`argv` under `policy`. stdin/stdout are pipes; stderr goes to `stderr` (a file object) or is discarded.

    forbidden: host paths that must not be visible even indirectly (the project checkout): interpreter and
    library paths inside them are left out of the system view."""

    def __init__(self, argv: list[str], policy: SandboxPolicy, *, stderr=None, forbidden: tuple[Path, ...] = ()):
        self.argv, self.policy, self.forbidden = list(argv), policy, forbidden
        self.stderr = stderr
        self.proc: subprocess.Popen | None = None
        self.uid: int | None = None
        self.init_pid: int | None = None   # the namespace's first process, as the host sees it
        self._ns: str | None = None
        # init_pid as a pidfd: a signal through it reaches that process or none, never one that took its pid since
        self._init_fd: int | None = None
        self._kill_lock, self._ended = threading.Lock(), False
        self._lease: _UidLease | None = None
        self.cage: MemoryCage | None = None   # the memory cgroup bounding the whole sandbox, when there is one
        self._oom_kills = 0
        self._memory_watch: MemoryWatch | None = None   # the same bound where no cgroup could be made
        self._ran_when_frozen: dict[tuple[int, int], int] | None = None   # freeze(): what each thread had run

    @property
    def description(self) -> str:
        who = f"uid {self.uid}" if self.uid is not None else "an unprivileged user namespace"
        return (f"{bwrap.bwrap_version()}: {who}, no capabilities, no_new_privs; own PID, mount, IPC, UTS and "
                f"network namespaces (loopback only)")

    def start(self) -> subprocess.Popen:
        if _INTERRUPTED.is_set():
            raise SandboxError("this process is being interrupted: it starts no new sandbox")
        bwrap.bwrap_version()  # SandboxUnavailable with the install hint, before anything else
        read_fd = write_fd = args_fd = filter_fd = None
        try:  # from the lease on, whatever fails releases it (and the cgroup): a uid must never stay taken host-wide
            if os.geteuid() == 0:
                self._lease = _UidLease()
                self.uid = self._lease.uid
                if self.policy.limits.sandbox_memory_bytes is not None:
                    self.cage = MemoryCage.create(f"seis-sandbox-{self.uid}",
                                                  self.policy.limits.sandbox_memory_bytes)
                read_only = frozenset(dir_ids(b.src for b in self.policy.binds if not b.writable))
                for b in self.policy.binds:
                    if b.writable:
                        _chown_tree(b.src, self.uid, b.dest, read_only)
                    else:
                        _readable_by_others(b.src, b.dest)
            # where programs and packages are found: the operator's PATH and PYTHONPATH as far as the sandbox shows
            found = {"PATH": bwrap.search_path(self.forbidden),
                     "PYTHONPATH": bwrap.python_search_path(self.forbidden)}
            env = {**{k: v for k, v in found.items() if v}, "HOME": "/tmp/home", "USER": "sandbox",
                   "LOGNAME": "sandbox", **self.policy.env}
            policy = dataclasses.replace(self.policy, env=env)
            read_fd, write_fd = os.pipe()
            # bwrap reads its options from a file descriptor, so its init (pid 1 inside, whose command line every
            # process of the sandbox can read) shows `bwrap --args N -- <command>`, not the host paths it binds
            filter_fd = seccomp.program_fd(self.policy.fixed_cpus)
            args_fd = _args_file(bwrap.options(policy, self.uid, write_fd, self.forbidden, filter_fd))
            launch = [*(self.cage.enter_argv() if self.cage else []), *_oom_first_argv(),
                      *_limit_args(policy, self.cage is not None),
                      "bwrap", "--args", str(args_fd), "--", *bwrap.user_switch(self.uid), *self.argv]
            self.proc = subprocess.Popen(launch, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE,
                                         stderr=self.stderr if self.stderr is not None else subprocess.DEVNULL,
                                         pass_fds=(write_fd, args_fd, filter_fd), start_new_session=True,
                                         # bwrap's own init (pid 1 inside) keeps the environment it started
                                         # with: give it nothing of ours (no keys in /proc/1/environ)
                                         env={"PATH": os.environ.get("PATH") or SAFE_PATH})
        except BaseException:
            if read_fd is not None:
                os.close(read_fd)
            self._release()
            raise
        finally:
            if write_fd is not None:
                os.close(write_fd)
            for fd in (args_fd, filter_fd):
                if fd is not None:
                    os.close(fd)
        with _STARTED_LOCK:  # from here on, an interrupt's kill_all() ends it even while it is still starting
            _STARTED.add(self)
        if _INTERRUPTED.is_set():  # one that came since the check above: its kill_all() may not have listed this one
            os.close(read_fd)
            self.kill()
            raise SandboxError("this process is being interrupted: it starts no new sandbox")
        with os.fdopen(read_fd, "rb") as info:
            raw = info.read()  # bwrap writes {"child-pid": N} once the namespaces exist, then closes it
        try:
            self.init_pid = int(json.loads(raw)["child-pid"])
            self._ns = _pid_ns(self.init_pid)
            self._init_fd = _pidfd(self.init_pid) if self._ns is not None else None
        except (ValueError, KeyError, TypeError):
            self.kill()  # whatever bwrap got to start before it failed (or was killed)
            raise SandboxError(f"the sandbox did not start (bwrap exit {self.proc.returncode}); "
                               f"see the process's stderr") from None
        with self._kill_lock:  # not for a sandbox an interrupt killed meanwhile
            if not self._ended and self.cage is None and self.policy.limits.sandbox_memory_bytes is not None:
                self._memory_watch = MemoryWatch(self.members, self.kill, self.policy.limits.sandbox_memory_bytes)
        return self.proc

    # --- the process tree ---------------------------------------------------------------------------------------
    def members(self) -> list[int]:
        """Host pids of every process in the sandbox, those in namespaces it made too (empty once it is gone)."""
        if self._ns is None:
            return []
        return [pid for pid in _processes() if _in_pid_ns(pid, self._ns) and _alive(pid)]

    def _signal_all(self, sig: int) -> None:
        for pid in self.members():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def freeze(self, timeout_s: float = FREEZE_TIMEOUT_S) -> None:
        """Stop every process of the sandbox; return once none of them can run again.

        SIGSTOP takes effect asynchronously, a fork may race the scan, and a member not yet stopped may SIGCONT
        one that is (two processes doing that to each other survive one SIGSTOP each), so this repeats rounds:
        stop every member not stopped, then look twice, a moment apart, sending nothing between. When both looks
        find every member stopped, none was left running to resume another. Raises SandboxError if that does not
        happen within timeout_s: an honest engine never resists, and one that does must not run beside a timed
        engine. What each thread has run so far is noted for thaw(), which tells whether any ran since."""
        deadline = time.monotonic() + timeout_s
        while True:
            running = self._not_stopped()
            if not running:
                time.sleep(_FREEZE_LOOK_S)
                running = self._not_stopped()
                if not running:
                    self._ran_when_frozen = self._threads_ran()
                    return
            if time.monotonic() > deadline:
                raise SandboxError(f"the sandbox's processes did not stay stopped for {timeout_s:g} s "
                                   f"({len(running)} kept running or were resumed)")
            for pid in running:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            time.sleep(_FREEZE_LOOK_S)

    def _not_stopped(self) -> list[int]:
        return [pid for pid in self.members() if any(s not in (b"T", b"t", *_DEAD) for s in _states(pid))]

    def _threads_ran(self) -> dict[tuple[int, int], int]:
        return {key: ns for pid in self.members() for key, ns in _run_ns(pid).items()}

    def thaw(self) -> bool:
        """Resume every process of the sandbox. Returns whether any of them ran since freeze() saw them all
        stopped (a thread ran, ended or was added): a stopped process is resumed by any SIGCONT the kernel sends
        it, and one the process arranged itself needs nobody of the sandbox running (a POSIX timer's signal, a
        file's F_SETSIG, a child's exit signal), so SIGSTOP alone cannot keep it from running beside a timed
        engine."""
        ran = self._ran_when_frozen is not None and self._threads_ran() != self._ran_when_frozen
        self._ran_when_frozen = None
        self._signal_all(signal.SIGCONT)
        return ran

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, timeout_s: float = 10.0) -> None:
        """End the whole tree; raises SandboxError if any process of it is still there after timeout_s. Once only:
        a later call (or one from another thread meanwhile) does nothing, for by then the uid, the pids and the
        namespace may be another sandbox's."""
        if self._memory_watch is not None:  # before the lock: the watch may be waiting for it, in its own kill()
            self._memory_watch.stop()
        with self._kill_lock:
            if self.proc is None or self._ended:
                return
            try:
                self._kill_once(timeout_s)
            finally:
                self._ended = True

    def _kill_once(self, timeout_s: float) -> None:
        with _STARTED_LOCK:
            _STARTED.discard(self)
        # Never a signal by a bare pid of a process that may be gone: pids are reused (32,768 of them on many
        # hosts), and a second kill() would otherwise reach whichever sandbox's launcher took the number since.
        if self._init_fd is not None:
            try:
                signal.pidfd_send_signal(self._init_fd, signal.SIGKILL)  # the kernel then kills the whole namespace
            except ProcessLookupError:
                pass
        self._signal_all(signal.SIGKILL)  # by namespace; belt and braces: a frozen member dies on SIGKILL too
        if self.proc.returncode is None:  # not reaped yet, so its pid (and group) are still its own
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        deadline = time.monotonic() + timeout_s
        while (left := self.members()) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.uid is not None:
            _kill(_leftovers({self.uid}))
            while _leftovers({self.uid}) and time.monotonic() < deadline:
                time.sleep(0.02)
            left = left or _leftovers({self.uid})
        self._release()
        if left:
            raise SandboxError(f"sandbox processes {left} survived SIGKILL for {timeout_s:.0f} s")
        self._ns = None  # gone: members() is empty, whatever namespace takes its number next

    def oom_kills(self) -> int:
        """Processes of this sandbox the kernel killed at its memory bound (0 without a memory cgroup); after
        kill(), what the cgroup counted before it was removed."""
        return self.cage.oom_kills() if self.cage is not None else self._oom_kills

    def memory_bound_reached(self) -> str | None:
        """How the sandbox was stopped at its whole-sandbox memory bound (Limits.sandbox_memory_bytes): by the
        kernel in its memory cgroup, or by the memory watch where there is none. None: it was not."""
        if killed := self.oom_kills():
            bound = self.policy.limits.sandbox_memory_bytes
            return (f"the sandbox reached its memory bound ({bound / 2**30:.1f} GiB for its processes, /tmp and "
                    f"/dev/shm together): the kernel killed {killed} process(es) in it")
        return self._memory_watch.exceeded if self._memory_watch is not None else None

    def _release(self) -> None:
        if self._memory_watch is not None:  # no wait: it may be in its own kill(), waiting for this one to end
            self._memory_watch.stop(wait=False)
        if self._init_fd is not None:
            os.close(self._init_fd)
            self._init_fd = None
        if self.cage is not None:
            self._oom_kills = self.cage.oom_kills()
            self.cage.remove()
            self.cage = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None


def _args_file(args: list[str]) -> int:
    """A descriptor holding args NUL-separated (for bwrap's --args), read from its start."""
    fd = os.memfd_create("seis-bwrap-args", 0)  # no MFD_CLOEXEC: bwrap inherits it through pass_fds
    os.write(fd, b"".join(a.encode() + b"\0" for a in args))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def kill_all(timeout_s: float = 10.0) -> int:
    """Kill every sandbox this process started and has not killed yet; returns how many. For a run that is being
    interrupted: its engines must die now, not when the calls of their gates have run out of time."""
    with _STARTED_LOCK:
        boxes = list(_STARTED)
    for box in boxes:
        try:
            box.kill(timeout_s)
        except SandboxError:
            pass  # its owner's own kill() reports survivors
    return len(boxes)


def interrupt() -> int:
    """This process is being interrupted (Ctrl-C, SIGTERM, its run cancelled): refuse every new sandbox from now on
    and kill the running ones, then the process groups of every open ProcessScope (dev benchmarks, which build
    engines of their own). Returns how many sandboxes were killed."""
    from .scope import close_all
    _INTERRUPTED.set()
    killed = kill_all()
    close_all()
    return killed


def interrupted() -> bool:
    return _INTERRUPTED.is_set()


@contextmanager
def interrupt_on_exit_signal() -> Iterator[None]:
    """Around a flow's body in the main thread: an interruption that reaches it (KeyboardInterrupt, Prefect's
    TerminationSignal for SIGTERM or a cancellation) kills every sandbox at once. Prefect waits for the task
    runner's threads before it runs the crash hooks, so without this a gate in flight would run to its end first."""
    try:
        yield
    except Exception:
        raise
    except BaseException:
        interrupt()
        raise


_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TooDeep(SandboxError, ValueError):
    """A bind holds directories nested more than MAX_DEPTH deep: the sandbox does not start over it."""


def _too_deep(shown: str, rel: str) -> TooDeep:
    parts = rel.split("/")
    where = "/".join(parts[:3] + ["..."] + parts[-1:]) if len(parts) > 4 else rel
    return TooDeep(f"{shown} holds directories nested more than {MAX_DEPTH} deep ({shown}/{where}); the sandbox "
                     f"does not start over such a tree")


def _walk_dirs(root_fd: int, shown: str, visit, skip: frozenset[tuple[int, int]] = frozenset()) -> None:
    """Every directory under root_fd (not root_fd itself), without recursion and without following a link:
    each is opened relative to its parent's descriptor with O_NOFOLLOW (a directory swapped for a link is skipped)
    and handed to visit(fd) before its entries; every other entry goes to visit(None, dir_fd, name, st). A
    directory whose (device, inode) is in `skip` is neither visited nor entered. A directory nested more than
    MAX_DEPTH deep is TooDeep, so at most MAX_DEPTH + 2 descriptors are open."""
    stack: list[tuple[int, list[str], str]] = []
    try:
        names = os.listdir(root_fd)  # before the dup: a failing listing leaves no descriptor open
        stack.append((os.dup(root_fd), names, ""))
        while stack:
            fd, names, prefix = stack[-1]
            if not names:
                os.close(fd)
                stack.pop()
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:  # gone since it was listed
                continue
            if not stat.S_ISDIR(st.st_mode):
                visit(None, fd, name, st)
                continue
            if (st.st_dev, st.st_ino) in skip:
                continue
            if len(stack) > MAX_DEPTH:
                raise _too_deep(shown, prefix + name)
            try:
                child = os.open(name, _DIR_NOFOLLOW, dir_fd=fd)
            except OSError:  # gone, or changed into a link or a file since it was listed: nothing of it is followed
                continue
            try:
                visit(child)
                entries = os.listdir(child)
            except OSError:  # changed meanwhile: left as it is
                os.close(child)
                continue
            except BaseException:
                os.close(child)
                raise
            stack.append((child, entries, prefix + name + "/"))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _chown_tree(root: Path, uid: int, shown: str = "the writable bind",
                skip: frozenset[tuple[int, int]] = frozenset()) -> None:
    """Give a writable bind to the sandbox's user. This runs as root over what an earlier sandbox wrote, so it goes
    through descriptors opened without following links: a directory swapped for a link while it runs is skipped,
    never followed onto a host file. A link itself is left to the session's cleanup; a hard-linked file is not
    given away (its other name may be anywhere). The directories in `skip` (read-only binds nested in this one:
    what the harness laid out in a workspace) stay the host's and are not walked: other sandboxes' trees laid out
    there lie deeper than in their own and would make this one TooDeep. A tree nested more than MAX_DEPTH deep is
    TooDeep (shown: the bind's mount point, for the message), never walked into a RecursionError."""
    def give(fd: int | None, dir_fd: int | None = None, name: str = "", st: os.stat_result | None = None) -> None:
        if fd is not None:
            os.fchown(fd, uid, uid)
        elif stat.S_ISLNK(st.st_mode) or st.st_nlink == 1:
            try:
                os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:  # gone since it was listed
                pass

    fd = os.open(root, _DIR_NOFOLLOW)
    try:
        os.fchown(fd, uid, uid)
        _walk_dirs(fd, shown, give, skip)
    finally:
        os.close(fd)


def _readable_by_others(root: Path, shown: str = "the read-only bind") -> None:
    """As root the sandbox's user is "other" to every host file, so what a read-only bind shows must be readable
    (directories searchable, executables executable) by others, whatever umask it was written under: under 077 a
    stored engine tree would otherwise be shown but unreadable. Contents, owners and tree hashes stay as they were.
    Like _chown_tree, it goes through descriptors and never follows a link (directories are changed with fchmod
    through a descriptor opened with O_NOFOLLOW, other entries with fchmodat's AT_SYMLINK_NOFOLLOW)."""
    def want(st: os.stat_result) -> int:
        mode = stat.S_IMODE(st.st_mode)
        return mode | stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) or mode & stat.S_IXUSR else 0)

    def widen(fd: int | None, dir_fd: int | None = None, name: str = "", st: os.stat_result | None = None) -> None:
        try:
            if fd is not None:
                st = os.fstat(fd)
                if want(st) != stat.S_IMODE(st.st_mode):
                    os.fchmod(fd, want(st))
            elif not stat.S_ISLNK(st.st_mode) and want(st) != stat.S_IMODE(st.st_mode):
                os.chmod(name, want(st), dir_fd=dir_fd, follow_symlinks=False)
        except (OSError, ValueError, NotImplementedError):
            pass  # read-only, foreign, or now a link: the process inside reports what it cannot read

    root = Path(root).resolve()  # bwrap shows a bind's target: widen that, not a link to it
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        widen(None, None, str(root), st)  # a file bind (root is resolved: not a link)
        return
    fd = os.open(root, _DIR_NOFOLLOW)
    try:
        widen(fd)
        _walk_dirs(fd, shown, widen)
    finally:
        os.close(fd)


@contextmanager
def frozen(sandboxes: list[SandboxedProcess]) -> Iterator[None]:
    """Every given sandbox stopped for the block, resumed afterwards."""
    for s in sandboxes:
        s.freeze()
    try:
        yield
    finally:
        for s in sandboxes:
            s.thaw()
