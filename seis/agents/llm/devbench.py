"""The dev benchmark an agent may run: the evaluator in a child process, returning only its dev speed table
(`render_dev_benchmark`): no correctness checks, thresholds or held-out data reach the agent.

    python -m seis.agents.llm.devbench --candidate WS --model tiny-qwen3 [--parent DIR] [--sizes quick]

The child is SEIS's own code (it builds the candidate only inside the engine sandbox), started with an
environment built from an allow-list: no API key reaches it, nor anything it starts. Its whole process tree is
killed at the time limit (its own process group; the engine sandboxes die with it).

For the `cli` agent, which runs inside a sandbox without the project, `BenchService` offers the same
benchmark through a unix socket shown in its sandbox; `$SEIS_DEV_BENCHMARK` is the client command.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...sandbox import SandboxError, frozen
from ...sandbox.scope import ProcessScope, ScopeClosed, die_with_parent
from ...workspace.tree import TreeError, copy_tree, remove_tree, scratch_dir
from .confine import MAX_FILE_BYTES, MAX_TREE_BYTES
from .secrets import SECRET_NAME, secret_values
from .sockets import accept_until

PROJECT_ROOT = Path(__file__).resolve().parents[3]
MAX_TABLE_BYTES = 64_000
# SEIS's own settings the evaluator reads (where models and data live), on top of the sandbox allow-list.
HARNESS_ENV = ("HOME", "PYTHONPATH", "SEIS_CACHE", "SEIS_GSM8K_DIR", "SEIS_PREPARED_DIR", "VIRTUAL_ENV",
               "PYENV_ROOT", "PYENV_VERSION", "TMPDIR")


def harness_env(environ=None) -> dict[str, str]:
    """The environment of a SEIS child that handles agent-written code: the sandbox allow-list plus where SEIS
    finds its models and data; never a variable with a key-like name or a value that is a secret."""
    from ...sandbox import allowed_env
    env = os.environ if environ is None else environ
    out = {**allowed_env(env), "PATH": env.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
    out.update({k: env[k] for k in HARNESS_ENV if k in env})
    secrets = set(secret_values(env))
    return {k: v for k, v in out.items() if not SECRET_NAME.search(k) and v not in secrets}


def run_tree(argv: list[str], timeout_s: float, cwd: Path | None = None, env: dict | None = None,
             max_bytes: int = MAX_TABLE_BYTES, scope: ProcessScope | None = None) -> tuple[int | None, str]:
    """(exit code or None at the time limit, stdout capped) of argv; its process group is killed either way.
    Started in `scope` (the session's), it is also killed when the scope closes. Its temporary files (TMPDIR,
    where engines it builds keep their caches) go in a directory of this process's, removed once the group is
    dead: a child killed at the limit cleans nothing up itself."""
    from .confine import _Capped
    scope = scope or ProcessScope()
    with scratch_dir("seis-child-") as tmp:
        child_env = {**(harness_env() if env is None else env), "TMPDIR": str(tmp)}
        proc = scope.popen(argv, cwd=cwd, env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
        reader = _Capped(proc.stdout, max_bytes)
        try:
            rc: int | None = proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # an exception raised into the wait (an interrupt, a step's timeout) kills the group too
            scope.done(proc)  # leftovers of the group, and the child at the limit
            proc.wait()
            reader.thread.join(timeout=5.0)
    return rc, reader.result()[0].decode("utf-8", errors="replace")


@dataclass(frozen=True)
class SubprocessDevBenchmark:
    """A DevBenchmark (workspace root -> table text) for make_agent: the parent is the session's parent tree."""

    model: str
    parent: Path | None = None
    device: str = "auto"
    sizes: str = "quick"          # smoke | quick | full, like RunConfig.gate
    seed: int = 0
    timeout_s: float = 1800.0
    deadline: float | None = None  # time.monotonic() past which no benchmark may run (the session's end)
    scope: ProcessScope | None = field(default=None, compare=False)  # the session's: killed with it

    def for_parent(self, parent: Path) -> "SubprocessDevBenchmark":
        """The same benchmark with the session's parent tree as the 'parent' row (unless one was set)."""
        return self if self.parent is not None else replace(self, parent=Path(parent))

    def argv(self, candidate: Path) -> list[str]:
        argv = [sys.executable, "-m", "seis.agents.llm.devbench", "--candidate", str(candidate), "--model",
                self.model, "--device", self.device, "--sizes", self.sizes, "--seed", str(self.seed),
                "--watch-pid", str(os.getpid())]
        return argv + (["--parent", str(self.parent)] if self.parent else [])

    def until(self, deadline: float | None) -> "SubprocessDevBenchmark":
        return replace(self, deadline=deadline)

    def within(self, scope: ProcessScope) -> "SubprocessDevBenchmark":
        return replace(self, scope=scope)

    def __call__(self, candidate: Path, timeout_s: float | None = None) -> str:
        limit = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        if self.deadline is not None:
            limit = min(limit, self.deadline - time.monotonic())
        if limit <= 1:
            return "dev benchmark: not run, the session's time is spent"
        try:
            rc, out = run_tree(self.argv(candidate), limit, cwd=PROJECT_ROOT, scope=self.scope)
        except ScopeClosed:
            return "dev benchmark: not run, the session has ended"
        if rc is None:
            return f"dev benchmark: no result within {limit:.0f} s (killed)"
        # stdout only: the table, or one line saying why there is none (stderr may hold evaluator internals).
        return out.strip() or f"dev benchmark failed (exit code {rc}) without a message"


CLIENT = """import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("/seis/bench.sock")
s.sendall(b"run\\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
text = data.decode("utf-8", "replace")
print(text)
sys.exit(0 if text.startswith("Dev benchmark") else 1)
"""


class BenchService:
    """The dev benchmark for a sandboxed process: a unix socket (in a private host directory, shown in the
    sandbox as /seis/bench.sock) that runs `bench` on a private copy of the workspace, one request at a time, and
    answers with the table text. `files()` are the binds to add; `command` is what $SEIS_DEV_BENCHMARK says.

    The agent is still running while it asks, so its tree is copied only while its whole sandbox is frozen
    (`attach`), by a copy that never follows a link (`copy_tree`); the benchmark then runs on that copy. Every
    process a benchmark starts is in this service's scope: `close` kills them, so none outlives the session."""

    def __init__(self, bench, workspace: Path, redact=lambda s: s):
        self.scope = ProcessScope()
        self.bench = bench.within(self.scope) if hasattr(bench, "within") else bench
        self.workspace, self.redact = Path(workspace), redact
        self.dir = Path(tempfile.mkdtemp(prefix="seis-bench-"))
        os.chmod(self.dir, 0o700)
        self.sock_path = self.dir / "bench.sock"
        self.client_path = self.dir / "client.py"
        self.client_path.write_text(CLIENT)
        os.chmod(self.client_path, 0o644)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.sock_path))
        os.chmod(self.sock_path, 0o666)  # the sandbox's own user connects; the directory keeps others out
        self.sock.listen(4)
        self.sock.settimeout(0.5)
        self.runs = 0
        self._box = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    command = "python3 /seis/bench_client.py"

    def files(self) -> dict[str, Path]:
        return {"bench.sock": self.sock_path, "bench_client.py": self.client_path}

    def attach(self, sandbox) -> None:
        """The agent's sandbox (a SandboxedProcess), frozen while its workspace is copied."""
        self._box = sandbox

    def _serve(self) -> None:
        for conn in accept_until(self.sock, self._stop):
            with conn:
                try:
                    conn.settimeout(10)
                    conn.recv(16)
                    self.runs += 1
                    text = self.redact(self._run())
                    conn.sendall(text.encode("utf-8", "replace")[:MAX_TABLE_BYTES])
                except OSError:
                    pass

    def _run(self) -> str:
        # the copy is agent-written code the benchmark builds and runs: removed with remove_tree, whatever it holds
        with scratch_dir("seis-bench-tree-") as scratch:
            os.chmod(scratch, 0o700)
            tree = scratch / "tree"
            try:
                with frozen([self._box]) if self._box is not None else nullcontext():
                    copy_tree(self.workspace, tree, max_file_bytes=MAX_FILE_BYTES, max_total_bytes=MAX_TREE_BYTES)
            except (TreeError, SandboxError, OSError) as e:
                why = str(e).replace(str(self.workspace), "/workspace")
                return f"dev benchmark refused: the workspace cannot be copied as an engine tree: {why}"
            return str(self.bench(tree))

    def close(self) -> None:
        """Stop serving and kill any benchmark still running (its engines die with it)."""
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass
        self.scope.close()
        self._thread.join(timeout=10)
        try:
            remove_tree(self.dir)
        except OSError:
            pass


def _gate_config(args: argparse.Namespace):
    from ...evaluator import GateConfig
    return GateConfig.preset(args.sizes, candidate=Path(args.candidate), model=args.model, device=args.device,
                             seed=args.seed, parent=Path(args.parent) if args.parent else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seis.agents.llm.devbench")
    p.add_argument("--candidate", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--parent")
    p.add_argument("--device", default="auto")
    p.add_argument("--sizes", choices=("smoke", "quick", "full"), default="quick")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--watch-pid", type=int, help="die with this process (the SEIS process that started us)")
    args = p.parse_args(argv)
    if args.watch_pid:
        die_with_parent(args.watch_pid)
    from ...evaluator import run_dev_benchmark, render_dev_benchmark
    try:
        print(render_dev_benchmark(run_dev_benchmark(_gate_config(args))))
    except Exception as e:  # noqa: BLE001 - one line for the agent, not a traceback into evaluator code
        print(f"dev benchmark refused or failed: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
