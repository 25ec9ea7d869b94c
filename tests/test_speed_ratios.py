"""The gate's speed ratios (evaluator.speed): paired, and what the throughput they stand for says."""
from __future__ import annotations

import pytest

from seis.evaluator.speed import _rows


def _passes(times: list[float], reps: int = 3, tokens: int = 64) -> list[list[tuple[int, float]]]:
    """reps repetitions of the same per-request times (tokens, seconds)."""
    return [[(tokens, t) for t in times] for _ in range(reps)]


def test_the_speedup_over_vanilla_agrees_with_throughput_when_a_few_requests_are_very_slow() -> None:
    """An engine twice as fast on six of eight requests and ten times slower on the other two moves a third of
    vanilla's tokens per second. A median of per-request ratios called it 2x, and the best-engine pick (which ranks
    by this ratio) would prefer it to an honest engine; the ratio must say what its throughput says."""
    vanilla = _passes([1.0] * 8)
    candidate = _passes([0.5] * 6 + [10.0] * 2)
    rows = {r.engine: r for r in _rows("dev-natural", ["candidate", "vanilla"],
                                        {"candidate": candidate, "vanilla": vanilla}, {})}
    cand, van = rows["candidate"], rows["vanilla"]
    assert cand.tok_per_s.median < van.tok_per_s.median / 2          # 8 s of vanilla's against 23 s
    assert cand.vs_vanilla == pytest.approx(cand.tok_per_s.median / van.tok_per_s.median)
    assert cand.vs_vanilla < 1.0


def test_the_ratio_is_paired_per_repetition_and_a_slow_pass_moves_it_little() -> None:
    """Drift from pass to pass hits both engines of a pass alike (their calls interleave): each repetition's ratio
    is taken within it, and the median over repetitions leaves one disturbed pass out."""
    vanilla = [[(64, 1.0)] * 4, [(64, 2.0)] * 4, [(64, 1.0)] * 4]        # the machine was slow in pass 1
    candidate = [[(64, 0.8)] * 4, [(64, 1.6)] * 4, [(64, 8.0)] * 4]      # ... and pass 2 hiccupped for it alone
    rows = {r.engine: r for r in _rows("dev-natural", ["candidate", "vanilla"],
                                        {"candidate": candidate, "vanilla": vanilla}, {})}
    assert rows["candidate"].vs_vanilla == pytest.approx(1.25)


def test_an_engine_that_produced_no_tokens_has_a_zero_ratio_not_a_crash() -> None:
    """A candidate answering every timed single request with an immediate stop (its batched correctness calls being
    fine) made the median of no ratios raise, and the gate ended without a verdict; its speed is 0."""
    vanilla = _passes([1.0] * 4)
    candidate = _passes([0.01] * 4, tokens=0)
    rows = {r.engine: r for r in _rows("dev-natural", ["candidate", "vanilla"],
                                        {"candidate": candidate, "vanilla": vanilla}, {})}
    assert rows["candidate"].tok_per_s.median == 0.0
    assert rows["candidate"].vs_vanilla == 0.0
