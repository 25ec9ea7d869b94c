"""run_shell for SDK agents: bash in a fresh sandbox per call (confine.py), time-limited on the whole process
tree, output capped while it is read. The sandbox shows only the workspace (writable; reports/ and peers/
read-only), the model read-only and private scratch; no keys, no network, no harness."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .confine import MAX_OUTPUT_BYTES, AgentSandbox, run_confined

MAX_OUTPUT_CHARS = MAX_OUTPUT_BYTES


def truncate(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


@dataclass(frozen=True)
class ShellResult:
    returncode: int | None   # None: killed at the time limit (or never started)
    output: str              # stdout and stderr interleaved, capped
    error: str | None = None
    limit_note: str | None = None

    def render(self, timeout_s: float) -> str:
        if self.error is not None:
            return f"[not run: {self.error}]\n{self.output}"
        status = f"timed out after {timeout_s:g} s (the command and everything it started were killed)" \
            if self.returncode is None else f"exit code {self.returncode}"
        if self.limit_note:
            status += f"; {self.limit_note}"
        return f"[{status}]\n{self.output}"


def run_shell(command: str, workspace: Path, timeout_s: float, sandbox: AgentSandbox,
              max_output_bytes: int = MAX_OUTPUT_BYTES, laid_out: Iterable[Path] = ()) -> ShellResult:
    """`bash -c command` in /workspace; returns when it exits or at timeout_s, with nothing of it left running.
    laid_out: the session material the harness laid out in the workspace (shown read-only)."""
    done = run_confined(["bash", "-c", command], sandbox.policy(workspace, laid_out=laid_out), timeout_s,
                        max_output_bytes=max_output_bytes)
    return ShellResult(None if done.timed_out else done.returncode, done.text(), done.error, done.limit_note)
