"""LLM agents through the providers' SDKs (anthropic, openai): a tool-use loop over one shared tool layer,
inside budgets, with a redacted transcript. Same interface as the offline agent: edit(workspace, context).

The loop: prompt -> model turn -> tool calls run in the workspace -> results back -> ... until the model calls
finish, or a budget / the wall clock / the API stops it. Nothing raises out of edit(): a session that cannot go
on ends "edited" when the tree changed (the gate judges it as it is), else "failed".

The API key stays in this process (the SDK client); shell commands run in a fresh sandbox per call
(confine.py) and the dev benchmark in a child with an allow-listed environment. The session's wall clock
bounds every API call too (the SDK's request timeout is the time left, and the loop stops waiting at the
deadline). When edit() returns, no process the agent started is alive, and the workspace has been checked
(finish_workspace): links, special files, oversized files and keys make the session "failed" with the reason."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ...workspace import TreeError, Workspace
from ...workspace.tree import remove_tree
from ..types import AgentResult, SessionContext
from .budget import Meter
from .confine import AgentSandbox, sanitize_workspace
from .conversation import Conversation, Turn, describe_error
from .pricing import price_for
from .prompt import Prompt, load_template, render_prompt
from .redact import Redactor
from .result import SessionEnd, build_result
from .secrets import SecretSet, scan_secrets
from .settings import SDK_DEFAULT_WALL_S, LLMSettings
from .tools import DevBenchmark, ToolOutcome, Toolbox
from .transcript import Transcript

TRANSCRIPT = "transcript.jsonl"
NUDGE = ("You replied without calling a tool. Continue with the tools, or end the session by calling "
         "finish(report=..., changes=[...], lessons=[...]).")
MAX_NUDGES = 1  # after that, a tool-less reply is taken as the report
# Tool calls one reply may have run. max_turns bounds API calls, not what one reply asks for: 2,000 read_file calls
# in one reply read 16 GB and held 120 M characters of results (redacted, logged, and sent again with every later
# request). Calls past it are answered with an error, not run (both APIs want an answer per call id); finish is
# always taken.
MAX_TOOL_CALLS_PER_TURN = 32

ConversationFactory = Callable[[LLMSettings, Prompt], Conversation]


def _sdk_conversation(settings: LLMSettings, prompt: Prompt) -> Conversation:
    if settings.backend == "anthropic":
        from .anthropic_chat import AnthropicConversation
        return AnthropicConversation(settings, prompt.system, prompt.user)
    if settings.backend == "openai":
        from .openai_chat import OpenAIConversation
        return OpenAIConversation(settings, prompt.system, prompt.user)
    raise ValueError(f"no SDK backend {settings.backend!r}")


def session_dir_of(workspace: Workspace, context: SessionContext) -> Path:
    return Path(context.session_dir) if context.session_dir is not None else workspace.root.parent


def tree_changed(workspace: Workspace) -> bool:
    try:
        return workspace.changed()
    except (TreeError, OSError):  # e.g. a symlink out of the tree: changed, and the gate will refuse it
        return True


def finish_workspace(workspace: Workspace, redactor: Redactor) -> str | None:
    """After the session (nothing of the agent alive): make the tree safe for the host (sanitize_workspace),
    blank every file that holds a key and remove every file or directory whose name holds one. Returns why the
    session is rejected, or None.

    The session material the harness laid out (Workspace.laid_out: read-only to the agent, the reports redacted
    when written) is neither counted against the workspace's limits nor scanned as the agent's output: a report
    whose text the scan, not the redactor, takes for a key, or a peer's tree near the entry bound, would otherwise
    reject every later session that inherits it."""
    problems = sanitize_workspace(workspace.root, skip=workspace.laid_out)
    leaks = scan_secrets(workspace.root, redactor.secrets, skip=workspace.laid_out)
    names = SecretSet(redactor.secrets)
    for leak in leaks:
        parts = leak.path.split("/")
        named = next((i for i, part in enumerate(parts) if names.find(part.encode("utf-8", "surrogateescape"))),
                     None)
        target = workspace.root.joinpath(*parts[: len(parts) if named is None else named + 1])
        try:
            if named is not None and target.is_dir() and not target.is_symlink():
                remove_tree(target)
            elif named is not None:
                target.unlink(missing_ok=True)
            elif target.is_file() and not target.is_symlink():
                target.write_text("# removed by SEIS: this file held an API key\n")
        except OSError as e:  # the session is rejected for the key all the same; the next leak is still blanked
            problems.append(f"{redactor.text(leak.path)}: could not be blanked ({e.strerror or e})")
    if not problems and not leaks:
        return None
    parts = problems + [f"{redactor.text(leak.path)}: held an API key (file blanked, or removed where its name "
                        f"held it)" for leak in leaks]
    shown = "; ".join(parts[:8]) + (f"; and {len(parts) - 8} more" if len(parts) > 8 else "")
    return f"workspace rejected: {shown}"


class ApiDeadline(Exception):
    """The session's wall clock ran out while an API call was in flight."""


def ask_within(conv: Conversation, max_output_tokens: int, request_timeout_s: float,
               time_left: float | None) -> Turn:
    """conv.ask, never waiting past the time left (a reply trickling in slower than the SDK's timeouts notice is
    abandoned). The SDK's own timeout is set a second beyond it, so the deadline, not a race between the SDK's
    timer and ours, says why the call ended."""
    if time_left is None:
        return conv.ask(max_output_tokens, timeout_s=request_timeout_s)
    if time_left <= 0:
        raise ApiDeadline()
    box: dict = {}

    def run() -> None:
        try:
            box["turn"] = conv.ask(max_output_tokens, timeout_s=max(1.0, min(request_timeout_s, time_left + 1.0)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e
    t = threading.Thread(target=run, daemon=True, name="seis-api-call")
    t.start()
    t.join(time_left)
    if t.is_alive():
        raise ApiDeadline()
    if "error" in box:
        raise box["error"]
    return box["turn"]


class LLMAgent:
    def __init__(self, settings: LLMSettings, dev_benchmark: DevBenchmark | None = None, *,
                 sandbox: AgentSandbox | None = None, conversation: ConversationFactory = _sdk_conversation):
        self.settings = settings
        self.name = settings.backend
        self.dev_benchmark = dev_benchmark
        self.sandbox = sandbox or AgentSandbox()  # SDK agents: never a network in the sandbox
        self.conversation = conversation

    def edit(self, workspace: Workspace, context: SessionContext) -> AgentResult:
        s = self.settings
        redactor = Redactor()
        transcript = Transcript(session_dir_of(workspace, context) / TRANSCRIPT, redactor)
        budget = context.budget
        wall = min((w for w in (s.wall_s, budget.max_wall_s) if w), default=SDK_DEFAULT_WALL_S)
        meter = Meter(price_for(s.resolved_model, s.prices), s.max_turns, budget.max_tokens, budget.max_cost_usd,
                      wall)
        template = load_template(s.prompt_template)
        prompt = render_prompt(template, workspace, context, mode="tools", max_turns=s.max_turns, wall_s=wall)
        bench = self.dev_benchmark
        if hasattr(bench, "for_parent"):  # the real benchmark: the parent row is this session's parent
            bench = bench.for_parent(workspace.parent_dir)
        if hasattr(bench, "until"):       # ... and it never runs past the session's end
            bench = bench.until(meter.deadline)
        sandbox, sandbox_note = self.sandbox, _sandbox_description()
        toolbox = Toolbox(workspace.root, bench, sandbox if sandbox_note.startswith("bubblewrap") else None,
                          s.shell_timeout_s, deadline=meter.deadline, redact=redactor.text,
                          laid_out=workspace.laid_out)
        transcript.log("session", agent=self.name, model=s.resolved_model, base_url=s.base_url,
                       prompt_version=prompt.version, chain=context.chain, session=context.session,
                       budget=asdict(budget), max_turns=s.max_turns, sandbox=sandbox_note, network="none",
                       price={"usd_per_mtok_in": meter.price.input_per_mtok,
                              "usd_per_mtok_out": meter.price.output_per_mtok,
                              "usd_per_mtok_cache_read": meter.price.cache_read_per_mtok,
                              "usd_per_mtok_cache_write": meter.price.cache_write_per_mtok,
                              "source": meter.price.source})
        transcript.log("prompt", system=prompt.system, user=prompt.user)
        try:
            conv = self.conversation(s, prompt)
            end = self._loop(conv, toolbox, meter, transcript)
        except Exception as e:  # noqa: BLE001 - client construction or an unexpected SDK error: end cleanly
            end = SessionEnd(False, f"API error: {describe_error(e, redactor.text)}")
        finally:
            toolbox.close()
        rejected = finish_workspace(workspace, redactor)
        changed = tree_changed(workspace)
        transcript.log("end", finished=end.finished, reason=end.reason, changed=changed, rejected=rejected,
                       **meter.summary(), tool_calls=dict(toolbox.calls))
        usage_note = (f"; usage unknown for {meter.unknown_usage} of {meter.turns} turns (tokens and cost "
                      "undercounted)" if meter.unknown_usage else "")
        notes = (f"{s.resolved_model} prompt={prompt.version} turns={meter.turns} "
                 f"tokens={meter.tokens_in}+{meter.tokens_out} cost=${meter.cost_usd:.4f} end={end.reason}"
                 + (f"; {rejected}" if rejected else "") + usage_note
                 + (f"; {meter.price.note}" if meter.price.note else ""))
        return build_result(self.name, context, changed, end, redactor, model=s.resolved_model,
                            tokens_in=meter.tokens_in, tokens_out=meter.tokens_out, cost_usd=meter.cost_usd,
                            wall_s=meter.wall_s, notes=notes, rejected=rejected)

    def _loop(self, conv: Conversation, toolbox: Toolbox, meter: Meter, transcript: Transcript) -> SessionEnd:
        nudges = 0
        while True:
            if (reason := meter.exhausted()) is not None:
                return SessionEnd(False, reason)
            try:
                turn = ask_within(conv, meter.output_cap(self.settings.max_output_tokens),
                                  self.settings.request_timeout_s, meter.time_left())
            except ApiDeadline:
                transcript.log("error", error="wall-clock limit reached during an API call")
                return SessionEnd(False, f"wall-clock budget spent during an API call ({meter.wall_s:.0f} of "
                                         f"{meter.max_wall_s:.0f} s)")
            except Exception as e:  # noqa: BLE001 - the SDK already retried what can be retried
                why = describe_error(e, transcript.redactor.text)
                transcript.log("error", error=why)
                return SessionEnd(False, f"API error after retries: {why}")
            meter.add(turn.usage)
            if meter.max_wall_s is not None and meter.wall_s >= meter.max_wall_s:
                self._log_turn(transcript, meter, turn)  # the reply came too late to act on
                return SessionEnd(False, f"wall-clock budget spent ({meter.wall_s:.0f} of {meter.max_wall_s:.0f} s)")
            self._log_turn(transcript, meter, turn)
            if not turn.calls:
                if nudges >= MAX_NUDGES:
                    return SessionEnd(True, "the model stopped without calling finish; its last message is the "
                                            "report", report=turn.text)
                nudges += 1
                transcript.log("nudge", text=NUDGE)
                conv.nudge(NUDGE)
                continue
            results: list[tuple] = []
            run = 0
            for call in turn.calls:
                run += call.name != "finish"
                if call.error is not None:
                    out = ToolOutcome(f"{call.name}: {call.error}", True)
                elif run > MAX_TOOL_CALLS_PER_TURN:
                    out = ToolOutcome(f"{call.name}: not run: one reply may run at most {MAX_TOOL_CALLS_PER_TURN} "
                                      "tool calls; ask again in the next turn", True)
                else:
                    out = toolbox.call(call.name, call.args)
                transcript.log("tool", id=call.id, name=call.name, args=call.args, is_error=out.is_error,
                               result=out.text)
                if out.finish is not None:
                    f = out.finish
                    return SessionEnd(True, "finish", f.report, f.changes, f.lessons)
                results.append((call, out))
            if meter.exhausted() is not None:
                continue  # no further call will carry the results: the loop's top ends the session
            note = meter.warning()
            if note:
                transcript.log("note", text=note)
            conv.answer(results, note)

    @staticmethod
    def _log_turn(transcript: Transcript, meter: Meter, turn: Turn) -> None:
        transcript.log("turn", n=meter.turns, text=turn.text, stop_reason=turn.stop_reason,
                       calls=[{"id": c.id, "name": c.name, "args": c.args} for c in turn.calls],
                       usage=None if turn.usage is None else asdict(turn.usage),
                       spent={"tokens": meter.tokens, "cost_usd": round(meter.cost_usd, 6)}, response=turn.raw)


def _sandbox_description() -> str:
    from ...sandbox import SandboxUnavailable, bwrap_version
    try:
        return f"{bwrap_version()} (one sandbox per shell call; workspace only, no network, no keys)"
    except SandboxUnavailable as e:
        return f"unavailable: {e} (run_shell refused)"
