"""LLM agents (anthropic, openai, cli): the REAL SDK clients against local fake servers speaking each API's wire
format (tests/llm_fakes.py). A scripted session reads, edits the engine, runs the shell and the (fake) dev
benchmark and finishes; plus confinement, budgets, retries, key redaction, the cli agent and make_agent wiring.
CPU only, no network beyond 127.0.0.1, a few seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from llm_fakes import FakeAPI, Fail, Reply
from seis.agents import Budget, SessionContext, parse_session_block, stamp_verdict
from seis.agents.llm import LLMSettings, check_ready
from seis.agents.llm.agent import LLMAgent
from seis.agents.llm.cli_agent import REPORT_FILE, CliAgent, parse_changes
from seis.agents.llm.pricing import price_for
from seis.agents.llm.prompt import load_template, render_prompt
from seis.agents.llm.redact import Redactor
from seis.agents.llm.secrets import find_secrets
from seis.agents.llm.confine import AgentSandbox
from seis.agents.llm.tools import TOOL_DEFINITIONS, Toolbox
from seis.agents.report import SessionBlock, render_report
from seis.engine_import import ENGINE_TEMPLATE
from seis.workspace import PeerMaterial, Report, prepare_workspace

FAKE_TABLE = "Dev benchmark: candidate tree abc, model tiny-qwen3\n| engine | tok/s |\n| candidate | 123.4 |"
DOCSTRING = '"""Sampling parameters and the per-step token choice."""'
EDIT = {"path": "engine/sampling.py", "old_string": DOCSTRING,
        "new_string": DOCSTRING + "\n# SEIS test: a harmless comment"}
CHECK = "python -c \"import ast; ast.parse(open('engine/sampling.py').read()); print('parsed ok')\""
FINISH = {"report": "## What I did\n\nAdded a comment to `engine/sampling.py`.", "changes": ["Sampling Comment"],
          "lessons": ["comments are free"]}
SESSION = [Reply("Reading the sampler.", (("read_file", {"path": "engine/sampling.py", "end_line": 5}),)),
           Reply(calls=(("edit_file", EDIT),)),
           Reply(calls=(("run_shell", {"command": CHECK}),)),
           Reply(calls=(("dev_benchmark", {}),)),
           Reply("Done.", (("finish", FINISH),))]
ENV_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_PROFILE",
            "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ADMIN_KEY", "SEIS_AGENT_COMMAND", "SEIS_AGENT_MODEL")
FAKE_KEY = "fake-key-0123456789-do-not-log"  # not shaped like a real key: only the env-based redaction hides it


@pytest.fixture
def env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)

    def use(api: FakeAPI, key: str = FAKE_KEY) -> None:
        prefix = "ANTHROPIC" if api.kind == "anthropic" else "OPENAI"
        monkeypatch.setenv(f"{prefix}_API_KEY", key)
        monkeypatch.setenv(f"{prefix}_BASE_URL", api.base_url)  # the SDK reads it: no base_url in settings
    return use


def _ws(tmp_path, reports=(), peers=()):
    return prepare_workspace(ENGINE_TEMPLATE, tmp_path / "session" / "workspace", list(reports), list(peers))


def _agent(kind, **kw):
    settings = {"model": "claude-haiku-4-5" if kind == "anthropic" else "gpt-4.1", "max_retries": 2, **kw}
    return LLMAgent(LLMSettings(kind, **settings), dev_benchmark=lambda root: FAKE_TABLE)


def _key_sent(req) -> str:
    return req.headers.get("x-api-key") or req.headers["authorization"].removeprefix("Bearer ")


def _transcript(tmp_path):
    return [json.loads(line) for line in (tmp_path / "session" / "transcript.jsonl").read_text().splitlines()]


# --- a whole scripted session, per SDK -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_scripted_session_edits_benchmarks_and_finishes(tmp_path, env, kind):
    ws = _ws(tmp_path)
    with FakeAPI(kind, list(SESSION)) as api:
        env(api)
        result = _agent(kind).edit(ws, SessionContext("c0", 1, budget=Budget(max_tokens=10_000)))
    assert result.status == "edited", result.notes
    assert result.applied == ("sampling-comment",) and result.agent == kind
    diff = ws.diff()
    assert "+# SEIS test: a harmless comment" in diff and diff.count("diff --git") == 1
    assert "engine/sampling.py" in diff and REPORT_FILE not in diff
    # tokens and cost: 5 turns of (100 in, 20 out) at the table's price
    assert (result.tokens_in, result.tokens_out) == (500, 100)
    assert result.cost_usd == pytest.approx(price_for(result.model).cost(500, 100)) and result.cost_usd > 0
    # the report: standard sections + a parseable block the gate can stamp
    block = parse_session_block(result.report_markdown, strict=True)
    assert (block.chain, block.session, block.agent, block.applied) == ("c0", 1, kind, ("sampling-comment",))
    assert "### What I did" in result.report_markdown and "comments are free" in result.report_markdown
    assert parse_session_block(stamp_verdict(result.report_markdown, "retained", "table"), strict=True).verdict
    assert "prompt=session_v1@" in result.notes and "end=finish" in result.notes
    # the transcript: prompt (with the contract), every turn and tool result, the end
    events = _transcript(tmp_path)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["session", "prompt"] and kinds[-1] == "end" and kinds.count("turn") == 5
    assert "Engine contract" in events[1]["user"] and events[0]["prompt_version"].startswith("session_v1@")
    tools = {e["name"]: e for e in events if e["type"] == "tool"}
    assert set(tools) == {"read_file", "edit_file", "run_shell", "dev_benchmark", "finish"}
    assert "class SamplingParams" not in tools["read_file"]["result"] and DOCSTRING in tools["read_file"]["result"]
    assert "parsed ok" in tools["run_shell"]["result"] and "exit code 0" in tools["run_shell"]["result"]
    assert tools["dev_benchmark"]["result"] == FAKE_TABLE
    assert events[-1]["changed"] is True and events[-1]["tokens_in"] == 500
    # the wire: the SDK read the key and base URL from the env; tool results went back with the right ids
    first, second, fourth = api.requests[0], api.requests[1], api.requests[3]
    if kind == "anthropic":
        assert _key_sent(first) == FAKE_KEY and first.body["max_tokens"] <= 10_000
        assert {t["name"] for t in first.body["tools"]} == {tool.name for tool in TOOL_DEFINITIONS}
        assert all("input_schema" in t for t in first.body["tools"])
        result_block = second.body["messages"][-1]["content"][0]
        assert result_block["type"] == "tool_result" and result_block["tool_use_id"] == "toolu_1_0"
        assert DOCSTRING in result_block["content"] and not result_block["is_error"]
        assert api.requests[4].body["messages"][-1]["content"][0]["content"] == FAKE_TABLE
    else:
        assert _key_sent(first) == FAKE_KEY
        assert first.body["messages"][0]["role"] == "system"
        assert {t["function"]["name"] for t in first.body["tools"]} == {tool.name for tool in TOOL_DEFINITIONS}
        tool_msg = second.body["messages"][-1]
        assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call_1_0"
        assert DOCSTRING in tool_msg["content"]
        assert fourth.body["messages"][-2]["tool_calls"][0]["function"]["name"] == "run_shell"


def test_settings_base_url_overrides_the_env(tmp_path, env, monkeypatch):
    ws = _ws(tmp_path)
    with FakeAPI("openai", [Reply(calls=(("finish", {"report": "nothing to do"}),))]) as api:
        env(api)
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
        result = _agent("openai", base_url=api.base_url).edit(ws, SessionContext("c0", 0))
    assert result.status == "no_change" and len(api.requests) == 1 and result.applied == ()


# --- confinement ------------------------------------------------------------------------------------------------

def test_paths_outside_the_workspace_are_refused(tmp_path):
    ws = _ws(tmp_path)
    outside = tmp_path / "secret.txt"
    outside.write_text("held-out answers")
    (ws.root / "engine" / "leak").symlink_to(outside)
    (ws.root / "engine" / "leakdir").symlink_to(tmp_path)
    box = Toolbox(ws.root)
    for name, args in [("read_file", {"path": "../secret.txt"}), ("read_file", {"path": "/etc/passwd"}),
                       ("read_file", {"path": "engine/leak"}), ("read_file", {"path": "engine/leakdir/secret.txt"}),
                       ("write_file", {"path": "../x", "content": "x"}), ("list_files", {"path": ".."}),
                       ("edit_file", {"path": "/etc/passwd", "old_string": "root", "new_string": "x"}),
                       ("search", {"pattern": "x", "path": "~"}),
                       ("write_file", {"path": "engine/leak", "content": "x"}),
                       ("write_file", {"path": "reports/c0-000.md", "content": "rewritten history"})]:
        out = box.call(name, args)
        assert out.is_error and "refused" in out.text, (name, args, out.text)
    assert outside.read_text() == "held-out answers" and not (tmp_path / "session" / "x").exists()
    # search skips the link leading out instead of reading through it
    assert "held-out" not in box.call("search", {"pattern": "held-out"}).text
    # wrong calls are errors for the model too, never exceptions
    assert box.call("edit_file", {"path": "engine/sampling.py", "old_string": "nope", "new_string": ""}).is_error
    ambiguous = box.call("edit_file", {"path": "engine/sampling.py", "old_string": "torch", "new_string": "x"})
    assert ambiguous.is_error and "times (add surrounding lines" in ambiguous.text
    assert box.call("read_file", {"path": "engine/sampling.py", "bogus": 1}).is_error
    assert box.call("no_such_tool", {}).is_error
    assert box.call("search", {"pattern": "("}).is_error
    assert box.call("dev_benchmark", {}).is_error  # none injected


def test_confinement_errors_go_back_to_the_model(tmp_path, env):
    ws = _ws(tmp_path)
    script = [Reply(calls=(("read_file", {"path": "/etc/passwd"}), ("write_file", {"path": "../x", "content": "x"}))),
              Reply(calls=(("finish", {"report": "could not escape"}),))]
    with FakeAPI("anthropic", script) as api:
        env(api)
        result = _agent("anthropic").edit(ws, SessionContext("c0", 0))
    results = api.requests[1].body["messages"][-1]["content"]
    assert [r["is_error"] for r in results] == [True, True] and all("refused" in r["content"] for r in results)
    assert result.status == "no_change" and not (tmp_path / "session" / "x").exists()


def test_shell_has_no_network_no_keys_and_sees_only_the_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    hidden = tmp_path / "heldout"
    hidden.mkdir()
    secret = "held-out answer 6cf1e09b"  # a string no temporary path can contain by chance
    (hidden / "answers.txt").write_text(secret)
    ws = _ws(tmp_path)
    with FakeAPI("openai", []) as api:  # something listening on the host's 127.0.0.1
        box = Toolbox(ws.root, sandbox=AgentSandbox())
        probe = (f"python -c \"import socket; socket.create_connection(('127.0.0.1', {api.port}), timeout=2)\" "
                 "&& echo REACHED || echo BLOCKED")
        assert "BLOCKED" in box.call("run_shell", {"command": probe}).text
        assert api.requests == []
    out = box.call("run_shell", {"command": "env; echo HOME=$HOME"}).text
    assert FAKE_KEY not in out and "OPENAI_API_KEY" not in out and str(ws.root) not in out.split("HOME=")[-1]
    denied = box.call("run_shell", {"command": f"cat {hidden}/answers.txt"}).text
    assert secret not in denied and "No such file" in denied
    assert "/workspace" in box.call("run_shell", {"command": "pwd"}).text
    slow = box.call("run_shell", {"command": "sleep 30", "timeout_s": 1})
    assert "timed out" in slow.text
    box.close()


# --- budgets ----------------------------------------------------------------------------------------------------

def test_turn_budget_ends_the_session_cleanly(tmp_path, env):
    ws = _ws(tmp_path)
    with FakeAPI("openai", [Reply(calls=(("list_files", {"path": "engine"}),))] * 10) as api:
        env(api)
        result = _agent("openai", max_turns=6).edit(ws, SessionContext("c0", 0))
    assert len(api.requests) == 6 and result.status == "failed" and result.applied == ()
    assert "turn budget spent" in result.report_markdown and "turn budget spent" in result.notes
    assert parse_session_block(result.report_markdown, strict=True).applied == ()
    # with 1 of 6 turns left, the model was told to wrap up
    assert "Budget nearly spent" in api.requests[5].body["messages"][-1]["content"]
    assert "Budget nearly spent" not in json.dumps(api.requests[4].body["messages"])
    assert [e["type"] for e in _transcript(tmp_path)].count("note") == 1


def test_a_session_without_a_wall_clock_still_ends_cleanly_before_its_steps_outer_timeout(tmp_path, env,
                                                                                           monkeypatch):
    """Turns do not bound time: each may run dev benchmarks (30 minutes each) and shell commands (10 minutes), and a
    run may allow 10,000 turns. Without agent_wall_s nothing bounded them, so a session could outlast its step's
    outer timeout, which stopped the whole run (and a resume ran the session again). An SDK session now always has
    a wall clock, inside that timeout, and ends at it as at any budget: cleanly, its edit gated."""
    import time
    from seis.agents.llm import agent as agent_module
    from seis.run_config import RunConfig
    from seis.session.timeouts import MARGIN_S, step_timeouts
    for kind in ("anthropic", "openai"):
        assert step_timeouts(RunConfig(agent=kind)).agent_s >= agent_module.SDK_DEFAULT_WALL_S + MARGIN_S
    monkeypatch.setattr(agent_module, "SDK_DEFAULT_WALL_S", 2.0)
    slow_bench = lambda root: time.sleep(0.1) or FAKE_TABLE  # noqa: E731
    ws = _ws(tmp_path)
    script = [Reply(calls=(("edit_file", EDIT),))] + [Reply(calls=(("dev_benchmark", {}),) * 2, delay_s=0.05)] * 60
    t0 = time.monotonic()
    with FakeAPI("openai", script) as api:
        env(api)
        agent = LLMAgent(LLMSettings("openai", model="gpt-4.1", max_retries=0, max_turns=1000),
                         dev_benchmark=slow_bench)
        result = agent.edit(ws, SessionContext("c0", 0))
    assert "wall-clock budget spent" in result.notes and time.monotonic() - t0 < 10
    assert result.status == "edited" and "+# SEIS test" in ws.diff()


def test_token_budget_keeps_an_edit_for_the_gate(tmp_path, env):
    ws = _ws(tmp_path)
    script = [Reply(calls=(("edit_file", EDIT),), usage=(150, 30))] + [
        Reply(calls=(("list_files", {}),), usage=(150, 30))] * 5
    with FakeAPI("anthropic", script) as api:
        env(api)
        result = _agent("anthropic").edit(ws, SessionContext("c0", 0, budget=Budget(max_tokens=600)))
    assert result.status == "edited" and result.applied == ("llm-edit",)
    assert "token budget spent" in result.report_markdown and len(api.requests) == 2
    assert (result.tokens_in, result.tokens_out) == (300, 60)
    assert api.requests[0].body["max_tokens"] <= 600  # the output cap follows what the budget has left
    assert "+# SEIS test" in ws.diff()


def test_cost_budget_and_unknown_model_pricing(tmp_path, env):
    ws = _ws(tmp_path)
    with FakeAPI("openai", [Reply(calls=(("list_files", {}),), usage=(1000, 1000))] * 5) as api:
        env(api)
        agent = _agent("openai", model="my-local-model", prices={"default": (100.0, 100.0)})
        result = agent.edit(ws, SessionContext("c0", 0, budget=Budget(max_cost_usd=0.5)))
    assert "cost budget spent" in result.notes and len(api.requests) == 3 and result.cost_usd == pytest.approx(0.6)
    assert price_for("my-local-model").source == "unknown" and price_for("my-local-model").cost(10**6, 10**6) == 0
    assert "cost counted as $0" in price_for("my-local-model").note
    assert price_for("claude-sonnet-4-5-20250929").source == "claude-sonnet-4-5"
    assert not price_for("gpt-5.5").known and not price_for("claude-sonnet-4-7").known  # no guessed prices
    assert price_for("claude-sonnet-4-6").known and price_for("gpt-5").known  # the backends' default models
    assert price_for("openrouter/gpt-4.1-mini").source == "gpt-4.1-mini"


# --- retries and failures ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, status", [("anthropic", 529), ("anthropic", 429), ("openai", 500)])
def test_server_errors_are_retried(tmp_path, env, kind, status):
    ws = _ws(tmp_path)
    script = [Fail(status), Reply(calls=(("edit_file", EDIT),)), Fail(503),
              Reply(calls=(("finish", {"report": "ok", "changes": ["c"]}),))]
    with FakeAPI(kind, script) as api:
        env(api)
        result = _agent(kind).edit(ws, SessionContext("c0", 0))
    assert result.status == "edited" and result.applied == ("c",) and len(api.requests) == 4
    assert (result.tokens_in, result.tokens_out) == (200, 40)  # failed attempts cost nothing


@pytest.mark.parametrize("kind, fail", [("anthropic", Fail(500)), ("openai", Fail(401, "bad key"))])
def test_api_failure_ends_the_session_cleanly(tmp_path, env, kind, fail):
    ws = _ws(tmp_path)
    with FakeAPI(kind, [Reply(calls=(("edit_file", EDIT),))] + [fail] * 10) as api:
        env(api)
        result = _agent(kind, max_retries=1).edit(ws, SessionContext("c0", 0))
    assert result.status == "edited" and result.applied == ("llm-edit",)  # the gate judges the tree as it is
    assert "API error after retries" in result.report_markdown
    assert len(api.requests) == (3 if fail.status >= 500 else 2)  # 5xx retried once, 401 not at all
    with FakeAPI(kind, [fail] * 10) as api:  # nothing changed: failed
        env(api)
        assert _agent(kind, max_retries=0).edit(_ws(tmp_path / "b"), SessionContext("c0", 0)).status == "failed"


def test_a_reply_without_tools_is_nudged_then_taken_as_the_report(tmp_path, env):
    ws = _ws(tmp_path)
    with FakeAPI("anthropic", [Reply("I think it is fine."), Reply("Really, nothing to change.")]) as api:
        env(api)
        result = _agent("anthropic").edit(ws, SessionContext("c0", 0))
    assert result.status == "no_change" and "nothing to change" in result.report_markdown
    assert "without calling a tool" in api.requests[1].body["messages"][-1]["content"]
    assert "nudge" in [e["type"] for e in _transcript(tmp_path)]


@pytest.mark.parametrize("content", [[{"type": "text", "text": "Nothing"}, {"type": "text", "text": "to change."}],
                                     42, {"text": "Nothing to change."}], ids=["parts", "number", "object"])
def test_a_reply_whose_text_is_not_a_string_ends_the_session_cleanly(tmp_path, env, monkeypatch, content):
    """The openai SDK builds its reply objects without checking types, so an OpenAI-compatible server's message
    content reaches the agent as it came: a list of text parts (some servers answer so), a number, an object.
    Taken as the report of a tool-less reply, it raised out of edit() (a list has no .strip()), which stopped
    the run; text parts are the reply's text, anything else ends the session like any malformed reply."""
    plain = FakeAPI._openai

    def with_content(r, n):
        body = plain(r, n)
        body["choices"][0]["message"]["content"] = content
        return body
    monkeypatch.setattr(FakeAPI, "_openai", staticmethod(with_content))
    with FakeAPI("openai", [Reply("a"), Reply("b")]) as api:
        env(api)
        result = _agent("openai").edit(_ws(tmp_path), SessionContext("c0", 1))
    if isinstance(content, list):
        assert result.status == "no_change" and "Nothing\nto change." in result.report_markdown
        assert api.requests[1].body["messages"][2] == {"role": "assistant", "content": "Nothing\nto change."}
    else:
        assert result.status == "failed" and "API error" in result.notes and len(api.requests) == 1


def _tool_result_sent(kind: str, body: dict) -> str:
    last = body["messages"][-1] if kind == "anthropic" else [m for m in body["messages"] if m["role"] == "tool"][-1]
    return last["content"][0]["content"] if kind == "anthropic" else last["content"]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_strings_no_utf8_writer_takes_neither_end_the_session_nor_reach_its_records(tmp_path, env, kind):
    """A file name that is not UTF-8 (os.listdir gives its bytes as lone surrogates) in a tool result, and half of
    a surrogate pair in a model's reply (JSON "\\ud83d": a cut emoji), are strings that cannot be encoded as UTF-8.
    Either one ended the session as an 'API error' (writing the transcript line raised, then the SDK's next
    request would have), and a report holding one would have stopped the run where report.md is written. They
    go on as visible escapes instead."""
    ws = _ws(tmp_path)
    os.close(os.open(os.fsencode(ws.root / "engine") + b"/bad\xffname.py", os.O_CREAT | os.O_WRONLY))
    script = [Reply("half a pair: \ud83d", (("list_files", {"path": "engine"}),)),
              Reply(calls=(("finish", {"report": "done \udc00", "changes": ["x\ud800y"], "lessons": ["l\ud83d"]}),))]
    with FakeAPI(kind, script) as api:
        env(api)
        result = _agent(kind).edit(ws, SessionContext("c0", 1))
    assert len(api.requests) == 2 and "end=finish" in result.notes, result.notes
    assert "engine/bad\\udcffname.py" in _tool_result_sent(kind, api.requests[1].body).splitlines()
    result.report_markdown.encode("utf-8")
    assert "done \\udc00" in result.report_markdown and "l\\ud83d" in result.report_markdown
    events = _transcript(tmp_path)  # every line is UTF-8 JSON
    assert [e["name"] for e in events if e["type"] == "tool"] == ["list_files", "finish"]
    assert "half a pair: \\ud83d" in [e["text"] for e in events if e["type"] == "turn"]
    # the name itself is still refused at the session's end, as every name that is not UTF-8 is
    assert "not UTF-8" in result.notes and not (ws.root / "engine").joinpath(os.fsdecode(b"bad\xffname.py")).exists()


# --- keys never written -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_api_keys_never_reach_transcript_report_or_notes(tmp_path, env, kind):
    ws = _ws(tmp_path)

    def echo_key(req):  # a model that repeats the key it was called with, everywhere it can
        key = _key_sent(req)
        return Reply(f"the key is {key}", (("run_shell", {"command": f"echo {key}; env"}),
                                           ("finish", {"report": f"my key: {key}", "changes": [key[:20]],
                                                       "lessons": [key]})))
    with FakeAPI(kind, [echo_key]) as api:
        env(api)
        result = _agent(kind).edit(ws, SessionContext("c0", 0))
    written = (tmp_path / "session" / "transcript.jsonl").read_text()
    for text in (written, result.report_markdown, result.notes, json.dumps(result.to_dict())):
        assert FAKE_KEY not in text
    assert "[REDACTED]" in written and "[REDACTED]" in result.report_markdown
    assert "OPENAI_API_KEY" not in written and "ANTHROPIC_API_KEY" not in written  # the shell's env is stripped


def test_redactor_catches_key_shapes_and_env_values():
    r = Redactor(environ={"MY_SERVICE_TOKEN": "tok-abcdefgh123", "HOME": "/root", "DEBUG": "1"})
    text = "a sk-ant-api03-AAAABBBBCCCCDDDD b sk-proj-0123456789abcdefXYZ c tok-abcdefgh123 /root 1"
    assert r.text(text) == "a [REDACTED] b [REDACTED] c [REDACTED] /root 1"
    assert r.value({"k": ["tok-abcdefgh123", 3]}) == {"k": ["[REDACTED]", 3]}


def test_a_key_a_provider_error_echoes_across_the_cut_is_redacted_whole():
    """A provider's error message is cut to 300 characters for the report; a key echoed across the cut kept a
    fragment of itself too short for the redactor to know, unless redaction runs before the cut."""
    from seis.agents.llm.conversation import describe_error
    r = Redactor(environ={"OPENAI_API_KEY": FAKE_KEY})
    error = RuntimeError("invalid request " + "x" * 270 + " " + FAKE_KEY + " was refused")  # 13 of it fit
    assert FAKE_KEY[:12] in r.text(describe_error(error))  # cut first, the fragment survives a later redaction
    line = describe_error(error, r.text)
    assert FAKE_KEY[:12] not in line and "[REDACTED]" in line


def _spelled(key: str, upper: int, lower: int, digit: int) -> str:
    """key in another Unicode alphabet of letters and digits (fullwidth, mathematical bold, ...)."""
    return "".join(chr(upper + ord(c) - 65) if c.isupper() else chr(lower + ord(c) - 97) if c.islower()
                   else chr(digit + ord(c) - 48) if c.isdigit() else c for c in key)


@pytest.mark.parametrize("how", ["after_dotted_capital_i", "fullwidth", "mathematical_bold", "key_shape_fullwidth"])
def test_redaction_covers_a_key_whatever_precedes_it_or_whichever_letters_spell_it(tmp_path, how):
    """A cli agent holds its key and writes its own report and output. Redaction worked on text.lower(), whose
    offsets shift after every "İ" (it lowers to two characters): 40 of them before the key put [REDACTED] 40
    characters past it and left the key in plain text. Fullwidth or mathematical letters spell a key that any
    reader reads at a glance (NFKC turns them back into it); neither the redactor nor the tree scan saw them."""
    key = "Zq8Lm3Xv7Tn2Rb6Yp1Wc5Hd9Kf4Gs0Jx"
    text = {"after_dotted_capital_i": "\u0130" * 40 + " my key: " + key + " and the rest of the report",
            "fullwidth": "my key: " + _spelled(key, 0xFF21, 0xFF41, 0xFF10) + " (fullwidth)",
            "mathematical_bold": "my key: " + _spelled(key, 0x1D400, 0x1D41A, 0x1D7CE) + " (bold)",
            "key_shape_fullwidth": "a key: " + _spelled("sk-ant-api03-AAAABBBBCCCCDDDD", 0xFF21, 0xFF41, 0xFF10)}[how]
    plain = "sk-ant-api03-AAAABBBBCCCCDDDD" if how == "key_shape_fullwidth" else key
    out = Redactor(secrets=[key], environ={}).text(text)
    assert "[REDACTED]" in out and plain.lower() not in unicodedata.normalize("NFKC", out).lower(), out
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "notes.md").write_text(text, encoding="utf-8")
    assert find_secrets(tmp_path / "tree", [key]), "the tree scan missed the key"


# --- prompt and memory ------------------------------------------------------------------------------------------

def test_prompt_carries_contract_history_peers_and_budget(tmp_path):
    block = SessionBlock("c0", 0, "anthropic", ("fused-rmsnorm",))
    mine = Report("c0", 0, render_report(block, "I fused RMSNorm.", ["fused-rmsnorm"], []), "rejected")
    peer_engine = _ws(tmp_path / "peer").root
    peer_report = Report("c1", 0, render_report(SessionBlock("c1", 0, "openai", ("graph-capture",)), "g", [], []),
                         "retained")
    ws = _ws(tmp_path, [mine], [PeerMaterial("c1", peer_engine, (peer_report,))])
    context = SessionContext("c0", 1, inherited_reports=(mine,), peers=(PeerMaterial("c1", peer_engine,
                                                                                      (peer_report,)),),
                             budget=Budget(max_tokens=50_000, max_cost_usd=2.0))
    p = render_prompt(load_template("session_v1"), ws, context, mode="tools", max_turns=30)
    assert "Engine contract" in p.user and "I fused RMSNorm." in p.user and "reports/c0-000.md" in p.user
    assert "fused-rmsnorm" in p.user.split("Failed or rejected")[1].splitlines()[0]
    assert "peers/c1/" in p.user and "graph-capture" in p.user
    assert "50,000" in p.user and "$2.00" in p.user and "30" in p.user and "`finish`" in p.user
    assert "{{" not in p.user and p.system and p.version.startswith("session_v1@")
    cli = render_prompt(load_template("session_v1"), ws, context, mode="cli")
    assert "SESSION_REPORT.md" in cli.user and "CHANGES:" in cli.user


def test_prompt_template_is_configurable_and_checked(tmp_path):
    custom = tmp_path / "mine.md"
    text = (Path(__file__).resolve().parents[1] / "seis/agents/prompts/session_v1.md").read_text()
    custom.write_text(text.replace("# SEIS session", "# MY session"))
    assert load_template(str(custom)).version.startswith("mine@")
    custom.write_text(text + "\n{{nonsense}}\n")
    with pytest.raises(ValueError, match="nonsense"):
        load_template(str(custom))
    with pytest.raises(ValueError, match="not found"):
        load_template("session_v999")


# --- the cli agent ----------------------------------------------------------------------------------------------

CLI_SCRIPT = ("python -c \"import sys, pathlib, os; prompt = sys.stdin.read(); assert 'Engine contract' in prompt; "
              "assert open(os.environ['SEIS_PROMPT_FILE']).read().strip() == prompt.strip(); "
              "p = pathlib.Path('engine/sampling.py'); p.write_text(p.read_text() + '# cli edit\\n'); "
              "pathlib.Path('SESSION_REPORT.md').write_text('## Done\\nAppended a comment.\\nCHANGES: cli-comment, "
              "second one\\n')\"")


def test_cli_agent_runs_a_command_and_reads_its_report(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    ws = _ws(tmp_path)
    result = CliAgent(LLMSettings("cli", command=CLI_SCRIPT)).edit(ws, SessionContext("c0", 2))
    assert result.status == "edited", result.report_markdown
    assert result.applied == ("cli-comment", "second-one") and not (ws.root / REPORT_FILE).exists()
    diff = ws.diff()
    assert "+# cli edit" in diff and REPORT_FILE not in diff
    block = parse_session_block(result.report_markdown, strict=True)
    assert (block.agent, block.session, block.applied) == ("cli", 2, ("cli-comment", "second-one"))
    assert "Appended a comment." in result.report_markdown and "CHANGES:" not in result.report_markdown
    assert (tmp_path / "session" / "prompt.md").is_file()
    events = _transcript(tmp_path)
    assert [e["type"] for e in events] == ["session", "prompt", "process", "end"]
    assert events[2]["returncode"] == 0 and "tokens/cost not metered" in result.notes


def test_cli_agent_failures_end_cleanly(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    result = CliAgent(LLMSettings("cli", command="echo $OPENAI_API_KEY; echo oops >&2; exit 3")).edit(
        _ws(tmp_path), SessionContext("c0", 0))
    assert result.status == "failed" and "exited with code 3" in result.report_markdown
    assert "oops" in result.report_markdown and FAKE_KEY not in (tmp_path / "session" / "transcript.jsonl").read_text()
    slow = CliAgent(LLMSettings("cli", command="echo x >> engine/sampling.py; sleep 30", wall_s=1))
    result = slow.edit(_ws(tmp_path / "b"), SessionContext("c0", 0))
    assert result.status == "edited" and "wall-clock limit" in result.report_markdown
    assert parse_changes("text\nCHANGES: none\n") == ((), "text\n")


_HOSTILE_REPORT = r"""
import json, sys, time
from pathlib import Path
from seis.agents import SessionContext
from seis.agents.llm import LLMSettings
from seis.agents.llm.cli_agent import CliAgent
from seis.engine_import import ENGINE_TEMPLATE
from seis.workspace import prepare_workspace
ws = prepare_workspace(ENGINE_TEMPLATE, Path(sys.argv[1]) / "session" / "workspace", [], [])
command = f"head -c 1048000 /dev/zero | tr '\\0' '{sys.argv[2]}' > SESSION_REPORT.md; echo 'All done.' >> SESSION_REPORT.md"
t0 = time.monotonic()
result = CliAgent(LLMSettings("cli", command=command)).edit(ws, SessionContext("c0", 0))
print(json.dumps({"elapsed": time.monotonic() - t0, "status": result.status, "report": result.report_markdown}))
"""


@pytest.mark.parametrize("fill", ["\\n", "`", "~"], ids=["newlines", "backticks", "tildes"])
def test_a_report_of_one_repeated_character_cannot_freeze_the_orchestrator(tmp_path, fill):
    """A cli agent writes a report of 1 MiB of one character. On newlines, `^\\s*CHANGES:` tried at every line
    start ran over all the newlines after it; on backticks or tildes, the report's fence pattern, tried at every
    character of the run, scanned the rest of it. O(n^2) steps either way, 40 minutes to hours inside re's C code,
    which holds the GIL: every thread of the orchestrator (other sessions, their watches, the API proxy) stood
    still. A child process runs the session, so that a regression fails here instead of freezing the test run."""
    try:
        done = subprocess.run([sys.executable, "-c", _HOSTILE_REPORT, str(tmp_path), fill], capture_output=True,
                              text=True, timeout=90, cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        pytest.fail("reading the cli agent's report froze its process: no result after 90 s")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["elapsed"] < 30 and out["status"] == "no_change" and "All done." in out["report"], out["elapsed"]


# --- wiring: config validation and make_agent -------------------------------------------------------------------

def test_make_agent_and_preflight(tmp_path, env, monkeypatch):
    from seis.run_config import RunConfig
    from seis.session.steps import AGENTS_AVAILABLE, make_agent
    assert {"anthropic", "openai", "cli"} <= set(AGENTS_AVAILABLE)
    for kind, var in [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY")]:
        config = RunConfig(agent=kind, out=tmp_path / kind)
        with pytest.raises(ValueError, match=var):
            config.preflight()
        assert not (tmp_path / kind).exists()
        monkeypatch.setenv(var, FAKE_KEY)
        agent = make_agent(RunConfig(agent=kind, agent_model="m", max_turns=7, agent_base_url="http://127.0.0.1:1"))
        assert isinstance(agent, LLMAgent) and agent.settings.max_turns == 7 and agent.settings.base_url
        assert agent.dev_benchmark.model == "tiny-qwen3"
    with pytest.raises(ValueError, match="agent_command"):
        RunConfig(agent="cli")
    assert isinstance(make_agent(RunConfig(agent="cli", agent_command="true")), CliAgent)
    monkeypatch.setenv("SEIS_AGENT_COMMAND", "codex exec --full-auto -")
    assert RunConfig(agent="cli").agent_command == "codex exec --full-auto -"
    with pytest.raises(ValueError, match="not found on PATH"):
        check_ready(LLMSettings("cli", command="no-such-agent-binary -p"))
    with pytest.raises(ValueError, match="prompt template"):
        check_ready(LLMSettings("cli", command="true", prompt_template="nope_v0"))


def test_evolve_refuses_a_missing_key_before_any_work(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k not in ENV_VARS}
    out = subprocess.run([sys.executable, "-m", "seis.cli", "evolve", "--agent", "openai", "--out",
                          str(tmp_path / "run"), "--store", str(tmp_path / "store")], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 2 and "OPENAI_API_KEY" in out.stderr, out.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()


def test_sdks_are_imported_lazily():
    code = ("import sys, seis.agents.llm, seis.session.steps, seis.run_config; "
            "print(sorted(m for m in ('anthropic', 'openai') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_cli_network_policy_is_configured_and_checked(monkeypatch):
    from pydantic import ValidationError

    from seis.agents.llm.settings import api_endpoints
    from seis.run_config import RunConfig
    from seis.session.steps import make_agent
    with pytest.raises(ValidationError, match="cli agent only"):
        RunConfig(agent="openai", agent_network="host")
    agent = make_agent(RunConfig(agent="cli", agent_command="true", agent_network="api",
                                 agent_pass_env=["ANTHROPIC_API_KEY"]))
    assert agent.settings.network == "api" and agent.settings.pass_env == ("ANTHROPIC_API_KEY",)
    assert api_endpoints(agent.settings, {}) == ["api.anthropic.com:443"]
    assert api_endpoints(LLMSettings("cli", command="x", network="api", base_url="http://127.0.0.1:8000/v1")) == \
        ["127.0.0.1:8000"]
    with pytest.raises(ValueError, match="needs the endpoint"):
        check_ready(LLMSettings("cli", command="true", network="api"))
    with pytest.raises(ValueError, match="not environment variable names"):
        check_ready(LLMSettings("cli", command="true", pass_env=("A; rm -rf /",)))
