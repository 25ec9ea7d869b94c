"""What a gate tells later agents (report.md, render_gate_for_agents) holds no words of the candidate engine's own
once it has answered held-out requests: a candidate that fails on purpose must not be able to hand the held-out
prompts it saw to the next session's agent through its error messages."""
from __future__ import annotations

import re
from pathlib import Path

from seis.evaluator import SpeedConfig, render_gate, render_gate_for_agents, run_gate
from seis.evaluator.workloads import load_gate_workloads
from seis.models import resolve_model

import evaluator_helpers as H

# Remembers the prompts of its first generate (the dev batch) and of the next (dev and held-out, mixed), then
# fails every single-prompt generate (the warm-ups and timed requests) with the held-out prompts it saw as its
# message, the part they share with the dev prompts left out so that what is secret comes first.
LEAK_ON_SINGLE_REQUESTS = '''

_seen = {"dev": None, "held": None}
_generate = Engine.generate


def _common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _leaking_generate(self, prompts, sampling=None):
    prompts = [list(p) for p in prompts]
    if _seen["dev"] is None:
        _seen["dev"] = prompts
    elif _seen["held"] is None:
        dev = _seen["dev"]
        _seen["held"] = [p[_common(p, dev[0]):] for p in prompts if p not in dev]
    if len(prompts) == 1 and _seen["held"]:
        raise ValueError("leak " + " | ".join(",".join(map(str, p)) for p in _seen["held"]))
    return _generate(self, prompts, sampling)


Engine.generate = _leaking_generate
'''


def _leaking_candidate(dest: Path) -> Path:
    root = H.copy_engine(dest)
    init = root / "engine" / "__init__.py"
    init.write_text(init.read_text() + LEAK_ON_SINGLE_REQUESTS)
    return root


def _secret_runs(heldout: list[tuple[int, ...]], dev: list[tuple[int, ...]], n: int = 4) -> set[str]:
    """Every run of n consecutive ids of a held-out prompt that no dev prompt holds, as the candidate writes it."""
    grams = lambda p: {tuple(p[i:i + n]) for i in range(len(p) - n + 1)}  # noqa: E731
    known = set().union(*(grams(p) for p in dev))
    return {",".join(map(str, g)) for p in heldout for g in grams(p) - known}


def _found(runs: set[str], text: str) -> list[str]:
    return [r for r in runs if re.search(rf"(?<![0-9]){re.escape(r)}(?![0-9])", text)]


def test_a_failing_candidate_cannot_pass_held_out_prompts_to_later_agents(prepared_dir: Path, tmp_path: Path):
    config = H.tiny_config(prepared_dir, _leaking_candidate(tmp_path / "candidate"),
                           speed=SpeedConfig(n_prompts=1, natural_max_new_tokens=8, fixed_max_new_tokens=8,
                                             batch_size=0, run_on_fail=True))
    result = run_gate(config)
    wl = load_gate_workloads(config, resolve_model(config.model))
    secret = _secret_runs(list(wl.heldout.prompts), list(wl.dev.prompts))
    assert secret
    # the operator's view keeps the engine's message (gate.json, `seis gate`): the leak was attempted
    assert result.verdict == "fail" and "engine.errors" in result.failed_checks
    assert _found(secret, render_gate(result)), "the candidate did not quote held-out ids: the test proves nothing"
    shown = render_gate_for_agents(result)
    assert not _found(secret, shown), shown
    # what agents still learn: which calls failed, and that the rows have no measurement
    errors = next(line for line in shown.splitlines() if "engine.errors" in line)
    assert "generate" in errors, shown
    assert any(r.error for r in result.speed.rows if r.engine == "candidate")


def test_problem_lines_quote_no_finish_reason_or_token_id_an_engine_chose():
    """The timed and dev checks' lines reach agents: a finish reason outside the contract, or the last token of a
    'stop' that is no stop id (an int of any size), could carry what a candidate saw in held-out prompts."""
    from seis.evaluator.checks import eos_problems, length_problems, stop_problems
    from seis.evaluator.engines import GenerationOut

    secret_id = 10 ** 60 + 7
    outs = [GenerationOut(token_ids=[5, 6], finish_reason="q: 48 apples?"),
            GenerationOut(token_ids=[5, secret_id], finish_reason="stop")]
    lines = (length_problems(outs, [2, 2], [3, 3], 64, exact=[True, True])
             + eos_problems(outs, [False, False], [2])
             + stop_problems(outs, [[5, 6], [5, 6]], [[6], [6]], [False, False], [2], [2, 2]))
    assert lines and any("finish_reason other than 'stop' or 'length'" in line for line in lines), lines
    assert not any("apples" in line or str(secret_id) in line for line in lines), lines
