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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...sandbox import (Bind, Limits, SandboxedProcess, SandboxError, SandboxPolicy, SandboxUnavailable, allowed_env,
                         sandbox_gpus)
from ...workspace import PEERS_DIR, REPORTS_DIR

WORKSPACE, MODEL, SEIS_FILES = "/workspace", "/model", "/seis"
SCRATCH_HOME = "/tmp/home"
AGENT_LIMITS = Limits(max_processes=1024, max_file_bytes=1 * 2**30, scratch_bytes=4 * 2**30)
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
               env: Mapping[str, str] | None = None, network: str | None = None) -> SandboxPolicy:
        """files: name -> host file, shown read-only at /seis/<name>; network: "none" (default) or "host"
        (the cli agent's explicit opt-in)."""
        root = Path(workspace).resolve()
        binds = [Bind(root, WORKSPACE, writable=True)]
        for sub in (REPORTS_DIR, PEERS_DIR):
            if (root / sub).is_dir() and not (root / sub).is_symlink():
                binds.append(Bind(root / sub, f"{WORKSPACE}/{sub}"))
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
    this returns, so nothing the command started outlives the call. Never raises for the command's sake."""
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
    threading.Thread(target=feed, daemon=True).start()
    if on_start is not None:
        on_start(box)
    timed_out = False
    try:
        proc.wait(timeout=max(0.0, timeout_s))
    except subprocess.TimeoutExpired:
        timed_out = True
    error = None
    try:
        box.kill()  # the whole tree, whether the command returned or not
    except SandboxError as e:
        error = str(e)
    for r in readers:
        r.thread.join(timeout=2.0)  # every writer is dead: EOF follows at once (never wait on a survivor)
    out, cut = readers[0].result()
    err, cut2 = readers[1].result() if len(readers) > 1 else (b"", 0)
    return Confined(None if timed_out else proc.returncode, out, err, timed_out, cut + cut2,
                    time.monotonic() - t0, error)


# --- after a session: the workspace as the host may use it ------------------------------------------------------

MAX_FILE_BYTES = 64 * 2**20       # one engine-tree file
MAX_TREE_BYTES = 512 * 2**20      # the whole workspace


def sanitize_workspace(root: Path) -> list[str]:
    """Make the workspace safe for the host to hash, diff, copy and gate (no agent process is alive when this
    runs): every symlink, FIFO, socket or device node is removed, so are files larger than MAX_FILE_BYTES,
    names that are not UTF-8 or hold a newline; ownership (as root) goes back to this process's user and every
    entry becomes readable. Returns one line per problem found (empty: the tree was clean); a non-empty answer
    rejects the session."""
    root = Path(root)
    problems: list[str] = []
    uid, gid = os.geteuid(), os.getegid()
    total = 0

    def fix(path: str, st: os.stat_result, is_dir: bool) -> None:
        try:
            if uid == 0 and (st.st_uid != uid or st.st_gid != gid):
                os.chown(path, uid, gid, follow_symlinks=False)
            want = stat.S_IMODE(st.st_mode) | (0o700 if is_dir else 0o600)
            if want != stat.S_IMODE(st.st_mode):
                os.chmod(path, want, follow_symlinks=False)
        except OSError:
            pass

    def remove(path: str, why: str) -> None:
        rel = os.path.relpath(path, root)
        problems.append(f"{_printable(rel)}: {why} (removed)")
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        fix(str(root), os.lstat(root), True)
    except OSError as e:
        return [f"workspace unreadable: {e.strerror}"]
    stack = [str(root)]
    while stack:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError as e:
            problems.append(f"{_printable(os.path.relpath(top, root))}: unreadable directory ({e.strerror})")
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            path = entry.path
            try:
                st = os.lstat(path)
            except OSError:
                continue
            bad_name = _bad_name(entry.name)
            if stat.S_ISLNK(st.st_mode):
                remove(path, f"a symlink to {_printable(os.readlink(path))}; the engine tree holds plain files only")
            elif stat.S_ISDIR(st.st_mode):
                fix(path, st, True)
                if bad_name:
                    import shutil
                    problems.append(f"{_printable(os.path.relpath(path, root))}/: {bad_name} (removed)")
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    stack.append(path)
            elif not stat.S_ISREG(st.st_mode):
                remove(path, "not a regular file (FIFO, socket or device)")
            elif bad_name:
                remove(path, bad_name)
            elif st.st_size > MAX_FILE_BYTES:
                remove(path, f"{st.st_size / 2**20:.0f} MiB, more than {MAX_FILE_BYTES // 2**20} MiB per file")
            else:
                fix(path, st, False)
                total += st.st_size
    if total > MAX_TREE_BYTES:
        problems.append(f"the workspace holds {total / 2**20:.0f} MiB, more than {MAX_TREE_BYTES // 2**20} MiB")
    return problems


def _bad_name(name: str) -> str | None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "a file name that is not UTF-8"
    if any(c in name for c in "\n\r\t") or any(ord(c) < 32 for c in name):
        return "a file name with control characters"
    return None


def _printable(s: str) -> str:
    return s.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(s, str) else repr(s)
