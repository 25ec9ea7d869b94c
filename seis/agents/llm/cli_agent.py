"""An external coding agent run headless in the workspace (`claude -p`, `codex exec`, aider, a script...).

The command line (RunConfig.agent_command) runs under bash in a sandbox (confine.py) whose working directory is
the workspace (/workspace), with the session prompt on stdin and in $SEIS_PROMPT_FILE (/seis/prompt.md). The
agent writes its report to SESSION_REPORT.md in the workspace root; SEIS reads it, removes it from the tree, and
wraps it into the standard report. $SEIS_DEV_BENCHMARK runs the dev benchmark through SEIS (BenchService).

Like every agent-run process it sees only the workspace (reports/ and peers/ read-only), the model and private
scratch. Its environment is the sandbox allow-list plus exactly the variables named in
RunConfig.agent_pass_env (its own API key, which it needs; they reach this process tree only, never a dev
benchmark or an SDK agent's shell). Its network is RunConfig.agent_network: "none" (default: loopback only) or
"host" (the host's network, an explicit opt-in). The whole tree is killed at the wall-clock limit and when the
command returns. Its output is saved, redacted, as transcript.jsonl. Tokens and cost are not metered here.
"""
from __future__ import annotations

import os
import re
import shlex
import tempfile
import time
from pathlib import Path

from ...workspace import Workspace
from ...workspace.tree import open_regular, remove_tree
from ..types import AgentResult, SessionContext
from .agent import TRANSCRIPT, finish_workspace, session_dir_of, tree_changed
from .confine import SEIS_FILES, WORKSPACE, AgentSandbox, Confined, run_confined
from .devbench import BenchService, SubprocessDevBenchmark
from .netproxy import START_FORWARDER, ApiProxy, proxy_env
from .prompt import load_template, render_prompt
from .redact import Redactor
from .result import SessionEnd, build_result, change_name
from .settings import LLMSettings, api_endpoints
from .shell import truncate
from .transcript import Transcript

REPORT_FILE = "SESSION_REPORT.md"
PROMPT_FILE = "prompt.md"
DEFAULT_WALL_S = 3600.0
MAX_CLI_OUTPUT_BYTES = 2 * 2**20      # stdout and stderr each, as kept in the transcript
MAX_REPORT_BYTES = 1 * 2**20
# Sourced before the command: the pass-through variables (the cli agent's own key) come from a file shown only
# in this sandbox, so they never sit on a command line (where `ps` would show them).
_WRAPPER = (START_FORWARDER + 'if [ -f /seis/env.sh ]; then set -a; . /seis/env.sh; set +a; fi; '
            'exec bash -c "$1"')
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Linear in the report: no part of it can match across a line end (`^\s*` could, and 1 MiB of newlines took it
# O(n^2) steps, about 40 minutes in re's C code holding the GIL: every thread of the orchestrator stood still).
_CHANGES = re.compile(r"^[ \t]*CHANGES:(.*)$\n?", re.IGNORECASE | re.MULTILINE)


def parse_changes(report: str) -> tuple[tuple[str, ...], str]:
    """(change names from the last `CHANGES:` line, the report without that line)."""
    matches = list(_CHANGES.finditer(report))
    if not matches:
        return (), report
    last = matches[-1]
    names = tuple(dict.fromkeys(n for n in (change_name(x.strip().strip("`")) for x in last.group(1).split(","))
                                if n and n != "none"))
    return names, report[:last.start()] + report[last.end():]


class CliAgent:
    name = "cli"

    def __init__(self, settings: LLMSettings, dev_benchmark: SubprocessDevBenchmark | None = None, *,
                 sandbox: AgentSandbox | None = None):
        if not settings.command:
            raise ValueError("agent 'cli' needs a command (agent_command)")
        self.settings = settings
        self.dev_benchmark = dev_benchmark
        self.sandbox = sandbox or AgentSandbox()

    def _env(self, bench: BenchService | None, proxy: ApiProxy | None) -> dict[str, str]:
        env = {"SEIS_PROMPT_FILE": f"{SEIS_FILES}/prompt.md", "SEIS_REPORT_FILE": f"{WORKSPACE}/{REPORT_FILE}",
               "SEIS_WORKSPACE": WORKSPACE}
        if bench is not None:
            env["SEIS_DEV_BENCHMARK"] = bench.command
        if proxy is not None:
            env.update(proxy_env())
        return env

    def _pass_env(self) -> dict[str, str]:
        return {k: os.environ[k] for k in self.settings.pass_env if ENV_NAME.match(k) and os.environ.get(k)}

    def edit(self, workspace: Workspace, context: SessionContext) -> AgentResult:
        s, t0 = self.settings, time.monotonic()
        passed = self._pass_env()
        redactor = Redactor(secrets=passed.values())
        session_dir = session_dir_of(workspace, context)
        transcript = Transcript(session_dir / TRANSCRIPT, redactor)
        timeout = min((w for w in (s.wall_s, context.budget.max_wall_s) if w), default=DEFAULT_WALL_S)
        prompt = render_prompt(load_template(s.prompt_template), workspace, context, mode="cli", wall_s=timeout,
                               report_file=REPORT_FILE)
        prompt_file = session_dir / PROMPT_FILE
        prompt_text = prompt.system + "\n\n" + prompt.user
        prompt_file.write_text(prompt_text, encoding="utf-8")
        report_path = workspace.root / REPORT_FILE
        _remove(report_path)
        network = s.network
        allowed = api_endpoints(s) if network == "api" else []
        transcript.log("session", agent=self.name, model=s.model, command=s.command, prompt_version=prompt.version,
                       chain=context.chain, session=context.session, timeout_s=timeout, network=network,
                       api_endpoints=allowed, passed_env=sorted(passed))
        transcript.log("prompt", system=prompt.system, user=prompt.user)
        private = Path(tempfile.mkdtemp(prefix="seis-cli-"))
        os.chmod(private, 0o700)
        bench = proxy = None
        try:
            files = {"prompt.md": _copy_private(prompt_file, private / "prompt.md")}
            if network == "api":
                proxy = ApiProxy(allowed)
                files.update({k: Path(v) for k, v in proxy.files().items()})
            if passed:
                envfile = private / "env.sh"
                envfile.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in passed.items()))
                os.chmod(envfile, 0o644)  # readable by the sandbox's user; the 0700 directory keeps others out
                files["env.sh"] = envfile
            if self.dev_benchmark is not None:
                b = self.dev_benchmark.for_parent(workspace.parent_dir)
                if hasattr(b, "until"):
                    b = b.until(t0 + timeout)
                bench = BenchService(b, workspace.root, redactor.text)
                files.update(bench.files())
            policy = self.sandbox.policy(workspace.root, files=files, env=self._env(bench, proxy),
                                         network="host" if network == "host" else "none", laid_out=workspace.laid_out)
            done = run_confined(["bash", "-c", _WRAPPER, "seis-cli", s.command], policy, timeout,
                                stdin=prompt_text.encode("utf-8"), max_output_bytes=MAX_CLI_OUTPUT_BYTES,
                                merge_stderr=False, on_start=bench.attach if bench is not None else None)
        except Exception as e:  # noqa: BLE001 - e.g. a socket could not be made: the session fails, the run goes on
            done = Confined(None, b"", b"", False, error=f"the cli agent could not start: {type(e).__name__}: {e}")
        finally:
            if bench is not None:
                bench.close()
            if proxy is not None:
                proxy.close()
            import shutil
            shutil.rmtree(private, ignore_errors=True)
        rc, out, err = done.returncode, done.text("stdout"), done.text("stderr")
        reason = done.error or (f"command killed at the wall-clock limit ({timeout:g} s)" if done.timed_out
                                else done.limit_note)
        transcript.log("process", returncode=rc, stdout=out, stderr=err, timed_out=done.timed_out,
                       output_cut_bytes=done.cut, wall_s=round(done.wall_s, 3),
                       dev_benchmark_runs=bench.runs if bench else 0,
                       limit=done.limit_note,
                       **({"network_passed": proxy.passed, "network_refused": proxy.refused,
                           "network_overloaded": proxy.overloaded} if proxy else {}))
        report = redactor.text(_read_report(report_path))
        changes, report = parse_changes(report)
        finished = rc == 0 and reason is None
        if reason is None and rc != 0:
            reason = f"command exited with code {rc}"
        if not report.strip():
            tail = truncate(err.strip() or out.strip(), 2000)
            report = f"No {REPORT_FILE} was written." + (f" Output tail:\n\n```\n{tail}\n```" if tail else "")
        end = SessionEnd(finished, reason or "finish", report, changes)
        rejected = finish_workspace(workspace, redactor)
        changed = tree_changed(workspace)
        transcript.log("end", finished=finished, reason=end.reason, changed=changed, rejected=rejected,
                       wall_s=round(time.monotonic() - t0, 3))
        notes = (f"cli `{_short(s.command)}` prompt={prompt.version} rc={rc} end={end.reason} network={network}"
                 + (f"; {rejected}" if rejected else "") + "; tokens/cost not metered for cli agents")
        return build_result(self.name, context, changed, end, redactor, model=s.model, notes=notes,
                            wall_s=time.monotonic() - t0, rejected=rejected)


def _remove(path: Path) -> None:
    """Remove what the agent left at path (a file, a link, a directory of any depth), never following a link."""
    remove_tree(path)


def _read_report(path: Path) -> str:
    """The report file, read without following a link (it could point at any host file) or waiting on a FIFO, and
    capped; then removed from the engine tree before anyone hashes or diffs it. Anything but a regular file: ""."""
    try:
        fd, _ = open_regular(path)
    except OSError:  # missing, a link, a FIFO, a directory: no report
        text = ""
    else:
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_REPORT_BYTES + 1)
        text = data[:MAX_REPORT_BYTES].decode("utf-8", errors="replace")
        if len(data) > MAX_REPORT_BYTES:
            text += f"\n\n[report cut at {MAX_REPORT_BYTES // 2**20} MiB]"
    _remove(path)
    return text


def _copy_private(src: Path, dest: Path) -> Path:
    dest.write_bytes(src.read_bytes())
    os.chmod(dest, 0o644)
    return dest


def _short(command: str | None, n: int = 60) -> str:
    c = " ".join((command or "").split())
    return c if len(c) <= n else c[:n - 3] + "..."
