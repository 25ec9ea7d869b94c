"""A hostile model against the HOST side of the SDK agents' loop: what its tool calls make SEIS's own process do.
Each test crosses (or tries to cross) a bound of the orchestrator's process: CPU held in C code under the GIL
(which stops every other session's thread), work past the session's deadline, an exception that ends the session
instead of becoming a tool error the model reads. CPU only, a few seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]

# --- a search glob built to take quadratic time in the host's regex engine --------------------------------------

_GLOB_ATTACK = r"""
import json, sys, time
from pathlib import Path
from seis.agents.llm import tools
from seis.agents.llm.tools import Toolbox
root, glob = Path(sys.argv[1]), sys.argv[2]
tools.SEARCH_TIMEOUT_S = 1.0
box = Toolbox(root)
t0 = time.monotonic()
out = box.call("search", {"pattern": "needle", "glob": glob})
elapsed = time.monotonic() - t0
print(json.dumps({"is_error": out.is_error, "text": out.text[:300], "elapsed": elapsed}))
"""


def test_a_pathological_search_glob_cannot_hold_the_host_past_the_search_limit(tmp_path):
    """The search pattern runs in a child killed at its limit, but the glob ran in the host: fnmatch's regex for
    '*' followed by a long run of '[!b]' takes time quadratic in a path's length on each of up to 20,000 files, in
    re's C code (about 25 s of the orchestrator's CPU per call on 20,000 paths near the 1,024-byte bound, past
    every time limit, and a turn may make many calls). The glob must obey the same time limit as the pattern."""
    root = tmp_path / "workspace"
    deep = root.joinpath(*["a" * 250] * 3)
    deep.mkdir(parents=True)
    for i in range(4000):
        (deep / f"{'a' * 190}{i:05d}").write_text("needle\n")
    glob = "*" + "[!b]" * 900 + "b"
    done = subprocess.run([sys.executable, "-c", _GLOB_ATTACK, str(root), glob], capture_output=True, text=True,
                          timeout=120, cwd=PROJECT, env={**os.environ, "PYTHONPATH": str(PROJECT)})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["elapsed"] < 3.0, out        # the search's limit (1 s) plus the child's start, not the glob's time
    assert out["is_error"] and "longer than" in out["text"], out


def test_a_glob_still_selects_files_as_before(tmp_path):
    """As Path.rglob and fnmatch take it (fnmatch's * also crosses a /)."""
    from seis.agents.llm.tools import Toolbox
    root = tmp_path / "workspace"
    (root / "engine" / "sub").mkdir(parents=True)
    (root / "engine" / "model.py").write_text("needle = 1\n")
    (root / "engine" / "sub" / "kern.py").write_text("needle = 2\n")
    (root / "engine" / "notes.md").write_text("needle\n")
    box = Toolbox(root)
    for glob, expect in [("*.py", {"engine/model.py", "engine/sub/kern.py"}),
                         ("sub/*.py", {"engine/sub/kern.py"}), ("**/*.md", {"engine/notes.md"}),
                         ("engine/*.py", {"engine/model.py", "engine/sub/kern.py"}), ("*.rs", set())]:
        out = box.call("search", {"pattern": "needle", "glob": glob})
        found = {line.split(":", 1)[0] for line in out.text.splitlines() if ":" in line}
        assert found == expect, (glob, out.text)


# --- one turn's tool calls: how many, and until when ------------------------------------------------------------

import time  # noqa: E402

import pytest  # noqa: E402

from llm_fakes import FakeAPI, Reply  # noqa: E402
from seis.agents import SessionContext  # noqa: E402
from seis.agents.llm import LLMSettings  # noqa: E402
from seis.agents.llm.agent import LLMAgent  # noqa: E402
from seis.engine_import import ENGINE_TEMPLATE  # noqa: E402
from seis.workspace import prepare_workspace  # noqa: E402

KEY = "fake-key-0123456789-do-not-log"


@pytest.fixture
def use_api(monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY",
                 "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)

    def use(api: FakeAPI) -> None:
        prefix = "ANTHROPIC" if api.kind == "anthropic" else "OPENAI"
        monkeypatch.setenv(f"{prefix}_API_KEY", KEY)
        monkeypatch.setenv(f"{prefix}_BASE_URL", api.base_url)
    return use


def _sdk_agent(kind: str, bench=None, **kw) -> LLMAgent:
    settings = {"model": "claude-haiku-4-5" if kind == "anthropic" else "gpt-4.1", "max_retries": 0, **kw}
    return LLMAgent(LLMSettings(kind, **settings), dev_benchmark=bench or (lambda root: "table"))


def _events(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "session" / "transcript.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_one_turn_cannot_run_an_unbounded_number_of_tool_calls(tmp_path, use_api, kind):
    """max_turns bounds API calls, not what one reply asks for: a reply of 2,000 read_file calls of an 8 MiB file
    made SEIS read 16 GB, hold 120 M characters of results in memory (sent again with every later request) and
    redact them all, in one turn. Calls past the per-turn bound are answered with an error, not run; finish is
    still taken."""
    from seis.agents.llm.agent import MAX_TOOL_CALLS_PER_TURN
    ws = prepare_workspace(ENGINE_TEMPLATE, tmp_path / "session" / "workspace", [], [])
    (ws.root / "engine" / "big.py").write_text(("x = 1\n" * 100_000))
    calls = tuple(("read_file", {"path": "engine/big.py"}) for _ in range(2000))
    with FakeAPI(kind, [Reply(calls=calls), Reply(calls=(("finish", {"report": "done"}),))]) as api:
        use_api(api)
        result = _sdk_agent(kind).edit(ws, SessionContext("c0", 0))
    tools = [e for e in _events(tmp_path) if e["type"] == "tool"]
    ran = [e for e in tools if e["name"] == "read_file" and not e["is_error"]]
    assert len(ran) == MAX_TOOL_CALLS_PER_TURN <= 64, len(ran)
    refused = [e for e in tools if e["name"] == "read_file" and e["is_error"]]
    assert len(refused) == 2000 - MAX_TOOL_CALLS_PER_TURN and "not run" in refused[0]["result"]
    # every call still gets its answer (both APIs want one per call id), and the session goes on to finish
    assert len(api.requests) == 2 and "end=finish" in result.notes, result.notes
    sent = json.dumps(api.requests[1].body)
    assert len(sent) < 8 * 2**20, len(sent)


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_no_tool_changes_the_tree_after_the_sessions_time_is_spent(tmp_path, use_api, kind):
    """The wall clock is checked before each API call, and by the shell, search and benchmark tools; the file
    tools ran whatever the time. A reply that puts a dev benchmark (which runs until the session's deadline)
    before its writes edited the tree after the session's end: the gate judged a tree written past its budget.
    Past the deadline no tool runs but finish."""
    ws = prepare_workspace(ENGINE_TEMPLATE, tmp_path / "session" / "workspace", [], [])

    def bench(root):  # the real one is bounded by the session's deadline (until()): it ends at it
        time.sleep(3.0)
        return "table"
    calls = (("dev_benchmark", {}),) + tuple(("write_file", {"path": f"engine/late_{i}.py", "content": "x"})
                                             for i in range(5)) + (("finish", {"report": "late"}),)
    with FakeAPI(kind, [Reply(calls=calls)]) as api:
        use_api(api)
        result = _sdk_agent(kind, bench=bench, wall_s=2.0).edit(ws, SessionContext("c0", 0))
    assert not list((ws.root / "engine").glob("late_*.py")), "files were written after the session's end"
    writes = [e for e in _events(tmp_path) if e["type"] == "tool" and e["name"] == "write_file"]
    assert len(writes) == 5 and all(e["is_error"] and "time" in e["result"] for e in writes)
    assert "end=finish" in result.notes and "late" in result.report_markdown


# --- arguments no JSON reader takes ---------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ['{"path": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                 '{"path": "engine/model.py", "start_line": 1' + "0" * 5000 + "}"],
                         ids=["nested_100k_deep", "5000_digit_integer"])
def test_arguments_no_json_reader_takes_are_a_tool_error_not_the_sessions_end(tmp_path, use_api, raw):
    """OpenAI tool arguments are a JSON string the host parses. Nesting past the parser's stack raised
    RecursionError and a 5,000-digit integer ValueError (Python's int limit), neither a JSONDecodeError: the
    session ended as an 'API error after retries' with the edit half done, and its turn was never recorded. The
    model must read an error and go on."""
    ws = prepare_workspace(ENGINE_TEMPLATE, tmp_path / "session" / "workspace", [], [])
    script = [Reply(calls=(("read_file", raw),)), Reply(calls=(("finish", {"report": "went on"}),))]
    with FakeAPI("openai", script) as api:
        use_api(api)
        result = _sdk_agent("openai").edit(ws, SessionContext("c0", 0))
    assert "end=finish" in result.notes, result.notes
    tool = next(e for e in _events(tmp_path) if e["type"] == "tool")
    assert tool["is_error"] and "arguments" in tool["result"] and len(tool["result"]) < 500, tool


def test_a_reply_the_transcript_cannot_write_is_noted_not_raised(tmp_path):
    """What a provider's reply holds reaches the transcript's recursive writers as it came (an Anthropic reply's
    `input`, the raw response): nesting past the stack raised RecursionError out of the unguarded part of the loop."""
    from seis.agents.llm.redact import Redactor
    from seis.agents.llm.transcript import Transcript
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    t = Transcript(tmp_path / "transcript.jsonl", Redactor(environ={}))
    t.log("turn", response={"content": deep}, big=10 ** 5000)
    t.log("end", finished=True)
    lines = [json.loads(line) for line in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    assert [e["type"] for e in lines] == ["turn", "end"] and "unrecorded" in lines[0]


# --- redaction's cost in the host ---------------------------------------------------------------------------------

def test_redaction_stays_fast_with_several_long_keys_and_finds_the_same_spans():
    """Every tool result, transcript line and report is redacted in the orchestrator's process, under the GIL. The
    needles (each key's forms and every 16-character piece of it, about 200 for a 100-character key) were one flat
    alternation, tried needle after needle at every position: with five such keys, 1 MB of text an agent chose took
    about 5 s, and each turn may return megabytes of tool results."""
    import random
    import re as re_mod
    import string

    from seis.agents.llm.redact import Redactor
    from seis.agents.llm.secrets import REDACTED
    rng = random.Random(7)
    keys = ["sk-ant-api03-" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(95))
            for _ in range(5)]
    r = Redactor(secrets=keys, environ={})
    text = "".join(rng.choice(string.ascii_letters) for _ in range(1_000_000))
    t0 = time.monotonic()
    assert r.text(text) == text
    assert time.monotonic() - t0 < 1.5
    # the same spans as the flat alternation, longest needle first
    flat = re_mod.compile("|".join(re_mod.escape(n) for n in sorted(r._set.needles, key=len, reverse=True)))
    for _ in range(200):
        k = rng.choice(keys)
        a = rng.randrange(len(k) - 20)
        piece = k[a:a + rng.randrange(16, len(k) - a + 1)]
        sample = "".join(rng.choice(string.ascii_letters) for _ in range(30)) + piece + " tail"
        squashed = re_mod.sub(r"[^a-z0-9]", "", sample.lower())
        assert [m.span() for m in r._set._rx.finditer(squashed)] == [m.span() for m in flat.finditer(squashed)]
        assert REDACTED in r.text(sample) and piece not in r.text(sample)
