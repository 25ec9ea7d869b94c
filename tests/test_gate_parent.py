"""The parent is an untrusted engine too (an earlier session's retained candidate), and the gate times the candidate
against it: nothing the parent does may be charged to the candidate."""
from __future__ import annotations

from pathlib import Path

from seis.evaluator import IsolationConfig, SpeedConfig, run_gate

import evaluator_helpers as H

PARENT_SLEEP_S, CALL_TIMEOUT_S, GATE_TIMEOUT_S = 7.0, 9.0, 25.0

# As a candidate it is E0. As a parent, which the gate asks no correctness calls (its first generate after the
# build is a single warm-up prompt), it answers every generate just inside its per-call limit: a handful of calls
# use up the gate's whole budget, without one failure of its own.
SLOW_AS_PARENT = f'''

import time as _time

_role = {{"parent": None}}
_generate = Engine.generate


def _slow_as_parent(self, prompts, sampling=None):
    if _role["parent"] is None:
        _role["parent"] = len(prompts) == 1
    if _role["parent"]:
        _time.sleep({PARENT_SLEEP_S})
    return _generate(self, prompts, sampling)


Engine.generate = _slow_as_parent
'''


def _slow_parent(dest: Path) -> Path:
    root = H.copy_engine(dest)
    init = root / "engine" / "__init__.py"
    init.write_text(init.read_text() + SLOW_AS_PARENT)
    return root


def test_a_parent_that_uses_up_the_gates_time_is_not_charged_to_the_candidate(prepared_dir: Path, tmp_path: Path):
    speed = SpeedConfig(n_prompts=1, natural_max_new_tokens=8, fixed_max_new_tokens=8, batch_size=0)
    iso = IsolationConfig(build_timeout_s=60, call_timeout_s=CALL_TIMEOUT_S, gate_timeout_s=GATE_TIMEOUT_S)
    result = run_gate(H.tiny_config(prepared_dir, H.copy_engine(tmp_path / "candidate"),
                                    parent=_slow_parent(tmp_path / "parent"), speed=speed, isolation=iso))
    # the candidate is E0: it passes, and its speed against vanilla is measured whatever the parent did
    assert result.verdict == "pass", [c for c in result.checks if not c.passed]
    rows = {r.engine: r for r in result.speed.rows if r.workload.startswith("dev-natural")}
    assert rows["candidate"].vs_vanilla is not None and rows["candidate"].error is None
    # the parent's slowness is the parent's: the gate ran out of none of the candidate's or the reference's time
    assert rows["parent"].error is not None or rows["parent"].tok_per_s.max < rows["vanilla"].tok_per_s.min


# As a parent it answers every timed generate 2 s late, well inside its limits: timed, and slower than any child.
# The candidate is a regression the timed workloads see: each of their calls 1 s late (they alone ask TIMED_TOKENS).
SLEEPY_PARENT_S, REGRESSION_S, TIMED_TOKENS = 2.0, 1.0, 9


def _sleep_in_generate(root: Path, seconds: float, as_parent_only: bool) -> Path:
    init = root / "engine" / "__init__.py"
    init.write_text(init.read_text() + f'''

import time as _time

_role = {{"parent": None}}
_generate = Engine.generate


def _sleepy(self, prompts, sampling=None):
    if _role["parent"] is None:
        _role["parent"] = len(prompts) == 1
    timed = all(getattr(s, "max_new_tokens", None) == {TIMED_TOKENS}
                for s in (sampling if isinstance(sampling, list) else [sampling]))
    if timed and (_role["parent"] or not {as_parent_only}):
        _time.sleep({seconds})
    return _generate(self, prompts, sampling)


Engine.generate = _sleepy
''')
    return root


def test_a_parent_slow_on_purpose_lowers_no_childs_bar_below_vanilla(prepared_dir: Path, tmp_path: Path):
    """The retain rule held a candidate to its parent's timing alone. An engine tells it is timed as a parent (its
    first generate is a one-prompt warm-up: a parent gets no correctness calls) and can then answer slowly, inside
    every limit: each child was retained however slow, here one several times slower than vanilla."""
    from seis.session.objective import slower_than_parent
    speed = SpeedConfig(n_prompts=1, natural_max_new_tokens=TIMED_TOKENS, fixed_max_new_tokens=TIMED_TOKENS,
                        batch_size=0)
    result = run_gate(H.tiny_config(
        prepared_dir, _sleep_in_generate(H.copy_engine(tmp_path / "candidate"), REGRESSION_S, False),
        parent=_sleep_in_generate(H.copy_engine(tmp_path / "parent"), SLEEPY_PARENT_S, True), speed=speed))
    assert result.verdict == "pass", [c for c in result.checks if not c.passed]
    rows = {r.engine: r for r in result.speed.rows if r.workload.startswith("dev-natural")}
    assert rows["candidate"].vs_parent > 1.5 and rows["candidate"].vs_vanilla < 0.5  # a bar below a regression
    lines = slower_than_parent(result.speed, "both")
    assert lines and all(line.startswith("slower than vanilla on ") for line in lines), lines
