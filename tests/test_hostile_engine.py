"""What a candidate engine can do to the host, attacked as a hostile engine would. On its reply stream: lines nobody
asked for (a flood that would fill host memory if the host kept reading), a reply nested deeper than the JSON
parser's stack, a line longer than any reply. The engine code runs in the worker's process, so it can reach the
stream however the worker hides it; these engines wrap the worker's own writer. On the host's disk: its compile
cache filled with sparse files (no disk used, but every reader reads their full length). Each ends in an
EngineError and the engine killed, with host memory and disk bounded. CPU only, real sandboxes."""
from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from seis.engine_host import EngineError, EngineProcess
from seis.models import resolve_model
from tests.evaluator_helpers import copy_engine

OPTIONS = {"device": "cpu", "max_seq_len": 64}


def _engine_writing(tmp_path: Path, after_build: str) -> Path:
    """E0, whose worker answers `build` as usual and then runs `after_build` (with `out`, the reply stream, and
    `payload`, the reply it was to write) instead of every later reply."""
    tree = copy_engine(tmp_path / "engine_dir")
    init = tree / "engine" / "__init__.py"
    init.write_text(init.read_text() + textwrap.dedent("""
        import __main__
        if hasattr(__main__, "_reply"):
            _orig, _built = __main__._reply, []
            def _hostile(out, **payload):
                if not _built:
                    _built.append(1)
                    _orig(out, **payload)
                    if FLOOD:
                        import threading
                        def _flood():
                            while True:
                                out.write("x" * 4095 + "\\n")
                                out.flush()
                        threading.Thread(target=_flood, daemon=True).start()
                    return
        """) + textwrap.indent(after_build, " " * 8) + "\n    __main__._reply = _hostile\n")
    return tree


def _rss_mib() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) // 1024


def test_a_flood_of_lines_nobody_asked_for_fills_the_engines_pipe_not_host_memory(tmp_path):
    tree = _engine_writing(tmp_path, "pass")
    init = tree / "engine" / "__init__.py"
    init.write_text("FLOOD = True\n" + init.read_text())
    with EngineProcess(tree, resolve_model("tiny-qwen3"), OPTIONS, timeout_s=60) as eng:
        eng.build()
        before = _rss_mib()
        time.sleep(3)  # unbounded, the host would have queued GiBs of lines by now
        assert eng._lines.qsize() <= 1
        assert _rss_mib() - before < 100
        with pytest.raises(EngineError, match="reply stream before 'stats' was asked"):
            eng.stats()
        assert eng.pids() == []


@pytest.mark.parametrize("line, message", [
    ('"[" * 200_000', "unreadable reply"),   # deeper than the parser's stack: a RecursionError, caught
    ('"{" + "x" * (64 * 2**20) + "}"', "longer than 64 MiB"),
    ('"[1, 2]"', "does not answer the current"),
])
def test_a_reply_the_host_cannot_trust_kills_the_engine(tmp_path, line, message):
    tree = _engine_writing(tmp_path, f"out.write({line} + '\\n'); out.flush()")
    init = tree / "engine" / "__init__.py"
    init.write_text("FLOOD = False\n" + init.read_text())
    with EngineProcess(tree, resolve_model("tiny-qwen3"), OPTIONS, timeout_s=60) as eng:
        eng.build()
        with pytest.raises(EngineError, match=message):
            eng.stats()
        assert eng.pids() == []
        with pytest.raises(EngineError, match="not running"):
            eng.stats()


def test_an_engine_filling_its_compile_cache_is_killed_and_the_error_says_why(tmp_path):
    tree = copy_engine(tmp_path / "engine_dir")
    init = tree / "engine" / "__init__.py"
    init.write_text(init.read_text() + textwrap.dedent("""
        import os, time
        for i in range(64):  # 1 GiB each, sparse: nothing on disk, 64 GiB to read
            with open(f"/cache/sparse{i}", "wb") as f:
                f.truncate(2**30)
        time.sleep(120)
    """))
    cache = tmp_path / "cache"
    cache.mkdir()
    t0 = time.monotonic()
    with EngineProcess(tree, resolve_model("tiny-qwen3"), OPTIONS, timeout_s=60, cache_dir=cache) as eng:
        with pytest.raises(EngineError, match="compile cache and log: more than 8.0 GiB"):
            eng.build()
        assert eng.pids() == []
    assert time.monotonic() - t0 < 30  # killed by the watch, not by the call's time limit


def test_an_engines_stats_are_kept_flat_and_small_whatever_it_replies(tmp_path):
    """stats() goes into gate.json and postval.json. An engine returning nesting 300 levels deep (past what the
    JSON writer of the gate's result takes), 10 MB of text and a mapping: the host keeps its plain numbers and
    short texts only, so its files stay writable and small."""
    tree = copy_engine(tmp_path / "engine_dir")
    init = tree / "engine" / "__init__.py"
    init.write_text(init.read_text() + textwrap.dedent("""
        _plain_stats = Engine.stats
        def _stats(self):
            deep = []
            for _ in range(300):
                deep = [deep]
            return {**_plain_stats(self), "deep": deep, "blob": "x" * 10_000_000, "map": {"a": 1},
                    "nan": float("nan"), "huge": 10 ** 40}
        Engine.stats = _stats
        """))
    from pydantic_core import to_json
    with EngineProcess(tree, resolve_model("tiny-qwen3"), OPTIONS, timeout_s=60) as eng:
        built = eng.build()
        stats = eng.stats()
    for kept in (stats, built["stats"]):
        assert kept["device"] == "cpu" and kept["max_seq_len"] == 64 and kept["decode_steps"] == 0
        assert not {"deep", "blob", "map", "nan", "huge"} & set(kept)
        assert len(to_json(kept)) < 4096  # and pydantic writes it (nesting past 255 levels fails there)


def test_an_engines_replies_are_kept_only_to_what_their_requests_can_be_judged_by(tmp_path):
    """The gate and post-validation keep every timed output of every repetition until it is judged, in the host's
    memory. An engine answering each request with 300,000 ids, a finish reason as long, extra outputs and extra
    keys (a reply line may hold 64 MiB, tens of millions of ids) kept them all; and each score position with
    thousands of candidates. The host keeps one past what was asked: an overrun still shows."""
    tree = copy_engine(tmp_path / "engine_dir")
    init = tree / "engine" / "__init__.py"
    init.write_text(init.read_text() + textwrap.dedent("""
        from dataclasses import dataclass
        @dataclass
        class _Flood:
            token_ids: list
            finish_reason: str
            extra: str = "x" * 100_000
        @dataclass
        class _FloodScore:
            token_logprobs: list
            top_ids: list
            top_logprobs: list
            extra: str = "x" * 100_000
        def _generate(self, prompts, params):
            return ([_Flood([7] * 300_000, "stop" + "\x1b[2J" * 100_000) for _ in prompts]
                    + [_Flood([7], "stop", "") for _ in range(500)])
        def _score(self, prompts, continuations, top_k=5):
            return ([_FloodScore([-1.0] * 100_000, [list(range(5_000))] * 3, [[-1.0] * 5_000] * 3) for _ in prompts]
                    + [_FloodScore([-1.0], [[1]], [[-1.0]], "") for _ in range(500)])
        Engine.generate, Engine.score = _generate, _score
        """))
    from seis.engine_host.client import Sampling
    with EngineProcess(tree, resolve_model("tiny-qwen3"), OPTIONS, timeout_s=60) as eng:
        eng.build()
        outs = eng.generate([[1, 2], [3]], [Sampling(max_new_tokens=4), Sampling(max_new_tokens=9)])
        scores = eng.score([[1, 2], [3]], [[4, 5], [6]], top_k=2)
    assert [len(o["token_ids"]) for o in outs] == [5, 10, 1]
    assert [o["finish_reason"] for o in outs] == ["stop" + "\x1b[2J" * 3] * 2 + ["stop"]
    assert all(set(o) == {"token_ids", "finish_reason"} for o in outs)
    assert [len(s["token_logprobs"]) for s in scores] == [3, 2, 1]
    assert [len(s["top_ids"]) for s in scores] == [3, 2, 1]
    assert all(len(row) == 3 for s in scores[:2] for row in s["top_ids"] + s["top_logprobs"])
    assert all("extra" not in s for s in scores)


def test_an_engines_error_reply_is_kept_short_however_long_its_message(tmp_path):
    """An engine's error reply became the EngineError's message whole: a 20 MB message per failed call went into
    the gate's failures (all of them held until the gate ended), into three checks' details in gate.json, the speed
    row's error and the dev benchmark's errors an agent reads. The host keeps the start of it, and says how much
    it left out."""
    from seis.engine_host.client import MAX_ERROR_CHARS
    tree = copy_engine(tmp_path / "engine_dir")
    init = tree / "engine" / "__init__.py"
    init.write_text(init.read_text() + textwrap.dedent("""
        def _generate(self, prompts, params):
            raise RuntimeError("the start of it " + "x" * 20_000_000)
        Engine.generate = _generate
        """))
    from seis.engine_host.client import Sampling
    with EngineProcess(tree, resolve_model("tiny-qwen3"), OPTIONS, timeout_s=60) as eng:
        eng.build()
        with pytest.raises(EngineError) as raised:
            eng.generate([[1, 2]], Sampling(max_new_tokens=2))
        assert eng.pids() != []  # an error reply is the engine's answer: it keeps serving
    message = str(raised.value)
    assert message.startswith("RuntimeError: the start of it xxx") and len(message) < MAX_ERROR_CHARS + 100
    assert "characters left out" in message
