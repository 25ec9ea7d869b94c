"""An external coding agent run headless in the workspace (`claude -p`, `codex exec`, aider, a script...).

The command line (RunConfig.agent_command) runs under bash in the workspace root with the session prompt on
stdin; the prompt is also in $SEIS_PROMPT_FILE (outside the workspace). The agent writes its report to
SESSION_REPORT.md in the workspace root; SEIS reads it, removes it from the tree, and wraps it into the
standard report. $SEIS_DEV_BENCHMARK holds a ready command line for the dev speed table.

Unlike the SDK agents it keeps the environment (the tool needs its own API key) and the network; its own
sandboxing (permission modes, codex's sandbox) applies. Its output is saved, redacted, as transcript.jsonl.
Tokens and cost are not metered here (0, with a note)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path

from ...workspace import Workspace
from ..types import AgentResult, SessionContext
from .agent import TRANSCRIPT, session_dir_of, tree_changed
from .devbench import SubprocessDevBenchmark
from .prompt import load_template, render_prompt
from .redact import Redactor
from .result import SessionEnd, build_result
from .settings import LLMSettings
from .shell import communicate_or_kill, truncate
from .transcript import Transcript

REPORT_FILE = "SESSION_REPORT.md"
PROMPT_FILE = "prompt.md"
DEFAULT_WALL_S = 3600.0
_CHANGES = re.compile(r"^\s*CHANGES:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


def parse_changes(report: str) -> tuple[tuple[str, ...], str]:
    """(change names from the last `CHANGES:` line, the report without that line)."""
    matches = list(_CHANGES.finditer(report))
    if not matches:
        return (), report
    last = matches[-1]
    names = tuple(dict.fromkeys(n for n in (re.sub(r"[^a-z0-9._-]+", "-", x.strip().strip("`").lower()).strip("-")
                                            for x in last.group(1).split(",")) if n and n != "none"))
    return names, report[:last.start()] + report[last.end():]


class CliAgent:
    name = "cli"

    def __init__(self, settings: LLMSettings, dev_benchmark: SubprocessDevBenchmark | None = None):
        if not settings.command:
            raise ValueError("agent 'cli' needs a command (agent_command)")
        self.settings = settings
        self.dev_benchmark = dev_benchmark

    def _env(self, workspace: Workspace, prompt_file: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SEIS_PROMPT_FILE=str(prompt_file), SEIS_REPORT_FILE=str(workspace.root / REPORT_FILE),
                   SEIS_WORKSPACE=str(workspace.root))
        if self.dev_benchmark is not None:
            bench = self.dev_benchmark.for_parent(workspace.parent_dir)
            env["SEIS_DEV_BENCHMARK"] = shlex.join(bench.argv(workspace.root))
        return env

    def edit(self, workspace: Workspace, context: SessionContext) -> AgentResult:
        s, t0 = self.settings, time.monotonic()
        redactor = Redactor()
        session_dir = session_dir_of(workspace, context)
        transcript = Transcript(session_dir / TRANSCRIPT, redactor)
        timeout = min((w for w in (s.wall_s, context.budget.max_wall_s) if w), default=DEFAULT_WALL_S)
        prompt = render_prompt(load_template(s.prompt_template), workspace, context, mode="cli", wall_s=timeout,
                               report_file=REPORT_FILE)
        prompt_file = session_dir / PROMPT_FILE
        prompt_file.write_text(prompt.system + "\n\n" + prompt.user, encoding="utf-8")
        report_path = workspace.root / REPORT_FILE
        report_path.unlink(missing_ok=True)
        transcript.log("session", agent=self.name, model=s.model, command=s.command, prompt_version=prompt.version,
                       chain=context.chain, session=context.session, timeout_s=timeout)
        transcript.log("prompt", system=prompt.system, user=prompt.user)
        rc, out, err, reason = self._run(workspace, prompt.system + "\n\n" + prompt.user,
                                         self._env(workspace, prompt_file), timeout)
        transcript.log("process", returncode=rc, stdout=out, stderr=err)
        report = ""
        if report_path.is_file():  # read, then out of the engine tree before anyone hashes or diffs it
            report = report_path.read_text(encoding="utf-8", errors="replace")
            report_path.unlink()
        changes, report = parse_changes(report)
        finished = rc == 0 and reason is None
        if reason is None and rc != 0:
            reason = f"command exited with code {rc}"
        if not report.strip():
            tail = truncate(err.strip() or out.strip(), 2000)
            report = f"No {REPORT_FILE} was written." + (f" Output tail:\n\n```\n{tail}\n```" if tail else "")
        end = SessionEnd(finished, reason or "finish", report, changes)
        changed = tree_changed(workspace)
        transcript.log("end", finished=finished, reason=end.reason, changed=changed,
                       wall_s=round(time.monotonic() - t0, 3))
        notes = (f"cli `{_short(s.command)}` prompt={prompt.version} rc={rc} end={end.reason}; "
                 "tokens/cost not metered for cli agents")
        return build_result(self.name, context, changed, end, redactor, model=s.model, notes=notes,
                            wall_s=time.monotonic() - t0)

    def _run(self, workspace: Workspace, prompt: str, env: dict[str, str],
             timeout: float) -> tuple[int | None, str, str, str | None]:
        try:
            proc = subprocess.Popen(["bash", "-c", self.settings.command], cwd=workspace.root, env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)  # its own process group: killable as a whole
        except OSError as e:
            return None, "", "", f"command could not start: {e.strerror or e}"
        out, err, timed_out = communicate_or_kill(proc, prompt.encode("utf-8"), timeout)
        reason = f"command killed at the wall-clock limit ({timeout:.0f} s)" if timed_out else None
        dec = lambda b: (b or b"").decode("utf-8", errors="replace")  # noqa: E731
        return proc.returncode if reason is None else None, dec(out), dec(err), reason


def _short(command: str | None, n: int = 60) -> str:
    c = " ".join((command or "").split())
    return c if len(c) <= n else c[:n - 3] + "..."
