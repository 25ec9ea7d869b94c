"""LLM agents through the providers' SDKs (anthropic, openai): a tool-use loop over one shared tool layer,
inside budgets, with a redacted transcript. Same interface as the offline agent: edit(workspace, context).

The loop: prompt -> model turn -> tool calls run in the workspace -> results back -> ... until the model calls
finish, or a budget / the wall clock / the API stops it. Nothing raises out of edit(): a session that cannot go
on ends "edited" when the tree changed (the gate judges it as it is), else "failed"."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ...workspace import TreeError, Workspace
from ..types import AgentResult, SessionContext
from .budget import Meter
from .conversation import Conversation, Turn, describe_error
from .pricing import price_for
from .prompt import Prompt, load_template, render_prompt
from .redact import Redactor
from .result import SessionEnd, build_result
from .settings import LLMSettings
from .shell import Sandbox, default_hidden_dirs, detect_sandbox
from .tools import DevBenchmark, ToolOutcome, Toolbox
from .transcript import Transcript

TRANSCRIPT = "transcript.jsonl"
NUDGE = ("You replied without calling a tool. Continue with the tools, or end the session by calling "
         "finish(report=..., changes=[...], lessons=[...]).")
MAX_NUDGES = 1  # after that, a tool-less reply is taken as the report

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
    except TreeError:  # e.g. a symlink out of the tree: changed, and the gate will refuse it
        return True


class LLMAgent:
    def __init__(self, settings: LLMSettings, dev_benchmark: DevBenchmark | None = None, *,
                 sandbox: Sandbox | None = None, hidden_dirs: tuple[Path, ...] | None = None,
                 conversation: ConversationFactory = _sdk_conversation):
        self.settings = settings
        self.name = settings.backend
        self.dev_benchmark = dev_benchmark
        self.sandbox = sandbox          # None: detected on first use (unshare --net when it works)
        self.hidden_dirs = hidden_dirs  # None: evaluator code and prepared / held-out data
        self.conversation = conversation

    def edit(self, workspace: Workspace, context: SessionContext) -> AgentResult:
        s = self.settings
        redactor = Redactor()
        transcript = Transcript(session_dir_of(workspace, context) / TRANSCRIPT, redactor)
        budget = context.budget
        wall = min((w for w in (s.wall_s, budget.max_wall_s) if w), default=None)
        meter = Meter(price_for(s.resolved_model, s.prices), s.max_turns, budget.max_tokens, budget.max_cost_usd,
                      wall)
        template = load_template(s.prompt_template)
        prompt = render_prompt(template, workspace, context, mode="tools", max_turns=s.max_turns, wall_s=wall)
        sandbox = self.sandbox or detect_sandbox()
        bench = self.dev_benchmark
        if hasattr(bench, "for_parent"):  # the real benchmark: the parent row is this session's parent
            bench = bench.for_parent(workspace.parent_dir)
        toolbox = Toolbox(workspace.root, bench, sandbox,
                          default_hidden_dirs() if self.hidden_dirs is None else self.hidden_dirs,
                          s.shell_timeout_s)
        transcript.log("session", agent=self.name, model=s.resolved_model, base_url=s.base_url,
                       prompt_version=prompt.version, chain=context.chain, session=context.session,
                       budget=asdict(budget), max_turns=s.max_turns, sandbox=sandbox.kind,
                       price={"usd_per_mtok_in": meter.price.input_per_mtok,
                              "usd_per_mtok_out": meter.price.output_per_mtok, "source": meter.price.source})
        transcript.log("prompt", system=prompt.system, user=prompt.user)
        try:
            conv = self.conversation(s, prompt)
            end = self._loop(conv, toolbox, meter, transcript)
        except Exception as e:  # noqa: BLE001 - client construction or an unexpected SDK error: end cleanly
            end = SessionEnd(False, f"API error: {describe_error(e)}")
        finally:
            toolbox.close()
        changed = tree_changed(workspace)
        transcript.log("end", finished=end.finished, reason=end.reason, changed=changed, **meter.summary(),
                       tool_calls=dict(toolbox.calls))
        notes = (f"{s.resolved_model} prompt={prompt.version} turns={meter.turns} "
                 f"tokens={meter.tokens_in}+{meter.tokens_out} cost=${meter.cost_usd:.4f} end={end.reason}"
                 + (f"; {meter.price.note}" if meter.price.note else ""))
        return build_result(self.name, context, changed, end, redactor, model=s.resolved_model,
                            tokens_in=meter.tokens_in, tokens_out=meter.tokens_out, cost_usd=meter.cost_usd,
                            wall_s=meter.wall_s, notes=notes)

    def _loop(self, conv: Conversation, toolbox: Toolbox, meter: Meter, transcript: Transcript) -> SessionEnd:
        nudges = 0
        while True:
            if (reason := meter.exhausted()) is not None:
                return SessionEnd(False, reason)
            try:
                turn = conv.ask(meter.output_cap(self.settings.max_output_tokens))
            except Exception as e:  # noqa: BLE001 - the SDK already retried what can be retried
                transcript.log("error", error=describe_error(e))
                return SessionEnd(False, f"API error after retries: {describe_error(e)}")
            meter.add(turn.tokens_in, turn.tokens_out)
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
            for call in turn.calls:
                out = (ToolOutcome(f"{call.name}: {call.error}", True) if call.error is not None
                       else toolbox.call(call.name, call.args))
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
                       usage={"tokens_in": turn.tokens_in, "tokens_out": turn.tokens_out},
                       spent={"tokens": meter.tokens, "cost_usd": round(meter.cost_usd, 6)}, response=turn.raw)
