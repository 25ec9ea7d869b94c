"""The retain rule's speed half (seis.session.objective): slower than the parent beyond the measured noise on a
timed workload of the run's objective means not retained; overlapping ranges are noise."""
from __future__ import annotations

import pytest

from seis.evaluator.schema import SpeedRow, SpeedStat, SpeedTable, SpeedWorkloadInfo
from seis.session.objective import slower_than_parent


def _stat(*values: float) -> SpeedStat:
    v = sorted(values)
    return SpeedStat(median=v[len(v) // 2], min=v[0], max=v[-1], n=len(v), values=list(values))


def _table(single: tuple, batched: tuple) -> SpeedTable:
    """single/batched: (candidate tok/s values, parent tok/s values) of the one-at-a-time and the batched workload."""
    wls = [SpeedWorkloadInfo(name="dev-natural", n_prompts=8, max_new_tokens=256, ignore_eos=False, workload_digest="a"),
           SpeedWorkloadInfo(name="dev-natural-batch32", n_prompts=32, max_new_tokens=256, ignore_eos=False,
                             workload_digest="a", batch=32)]
    rows = []
    for wl, (cand, parent) in zip(wls, (single, batched)):
        for engine, values in (("candidate", cand), ("parent", parent), ("vanilla", parent)):
            rows.append(SpeedRow(workload=wl.name, engine=engine, tokens_per_pass=1.0, tok_per_s=_stat(*values),
                                 latency_ms=_stat(1.0, 1.0, 1.0)))
    return SpeedTable(device="cuda", reps=3, method="m", workloads=wls, rows=rows)


FASTER_ALONE_SLOWER_BATCHED = _table(((1500, 1490, 1510), (560, 550, 570)), ((4400, 4380, 4420), (4900, 4880, 4950)))
NOISE = _table(((540, 600, 580), (560, 550, 570)), ((4850, 4990, 4900), (4900, 4880, 4950)))


@pytest.mark.parametrize("objective, slower_on", [("both", ["dev-natural-batch32"]), ("throughput", ["dev-natural-batch32"]),
                                                  ("single", []), ("none", [])])
def test_a_batched_regression_is_caught_unless_the_objective_is_single_requests(objective, slower_on):
    lines = slower_than_parent(FASTER_ALONE_SLOWER_BATCHED, objective)
    assert [line.split(" on ")[1].split(" ")[0] for line in lines] == slower_on
    if lines:
        assert "4400.0 tok/s (4380.0–4420.0) against 4900.0 (4880.0–4950.0)" in lines[0]


def test_overlapping_ranges_are_noise_whichever_way_the_medians_lean():
    assert slower_than_parent(NOISE, "both") == []
    assert slower_than_parent(None, "both") == []


def test_a_parent_without_a_timing_leaves_the_candidate_held_to_vanilla():
    """A parent that failed its timed requests (an earlier candidate can, on purpose, once it is a parent) left the
    workload with no speed check at all: every child was retained, however slow."""
    table = FASTER_ALONE_SLOWER_BATCHED
    rows = [r.model_copy(update={"tok_per_s": None, "error": "timed out"}) if r.engine == "parent" else r
            for r in table.rows]
    lines = slower_than_parent(table.model_copy(update={"rows": rows}), "both")
    assert len(lines) == 1 and lines[0].startswith("slower than vanilla (its parent was not timed) on "
                                                   "dev-natural-batch32"), lines
    no_parent = [r for r in table.rows if r.engine != "parent"]
    assert len(slower_than_parent(table.model_copy(update={"rows": no_parent}), "both")) == 1


def test_an_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="objective must be one of"):
        slower_than_parent(NOISE, "latency")


def test_the_objective_defaults_to_both_on_cuda_and_none_elsewhere(tmp_path):
    from seis.run_config import RunConfig
    assert RunConfig(device="cuda", out=tmp_path / "a").objective == "both"
    assert RunConfig(device="cpu", out=tmp_path / "b").objective == "none"
    assert RunConfig(device="cpu", objective="throughput", out=tmp_path / "c").objective == "throughput"


def _with_vanilla(table: SpeedTable, workload: str, *values: float) -> SpeedTable:
    """table with vanilla's tok/s on `workload` replaced by these values."""
    return table.model_copy(update={"rows": [r.model_copy(update={"tok_per_s": _stat(*values)})
                                             if (r.workload, r.engine) == (workload, "vanilla") else r
                                             for r in table.rows]})


def test_a_parent_slow_on_purpose_is_no_floor_vanilla_is():
    """An engine can tell when it is timed as a parent (it is asked no correctness calls before its warm-up), so one
    that then runs slowly, in one pass or in all, lowered the bar for every child: a candidate at a third of
    vanilla's speed on the batched workload was retained, as its parent's range (one slow pass) reached below it."""
    one_slow_pass = _with_vanilla(_table(((1500, 1490, 1510), (560, 550, 570)),
                                         ((1500, 1480, 1520), (4900, 400, 4950))), "dev-natural-batch32",
                                  4900, 4880, 4950)
    lines = slower_than_parent(one_slow_pass, "both")
    assert len(lines) == 1 and lines[0].startswith("slower than vanilla on dev-natural-batch32"), lines
    all_slow = _with_vanilla(_table(((1500, 1490, 1510), (560, 550, 570)), ((1500, 1480, 1520), (400, 390, 410))),
                             "dev-natural-batch32", 4900, 4880, 4950)
    assert len(slower_than_parent(all_slow, "throughput")) == 1


def test_steps_each_within_noise_of_their_parent_do_not_add_up_to_a_regression_on_vanilla():
    """Each retained step a little slower than its parent, within noise: after a few sessions the chain's engine was
    slower than vanilla beyond noise, and its next step (again within noise of its parent) was retained."""
    drifted = _with_vanilla(_table(((900, 910, 920), (915, 925, 935)), ((4400, 4380, 4420), (4410, 4390, 4450))),
                            "dev-natural", 1000, 990, 1010)
    lines = slower_than_parent(drifted, "single")
    assert len(lines) == 1 and lines[0].startswith("slower than vanilla on dev-natural"), lines
    within_vanillas_noise = _with_vanilla(drifted, "dev-natural", 920, 900, 940)
    assert slower_than_parent(within_vanillas_noise, "single") == []


def _batched(cand: tuple, parent: tuple, vanilla: tuple, parent_is_vanilla: bool = False) -> SpeedTable:
    """The batched workload alone, each engine's tok/s per repetition (in repetition order)."""
    wl = SpeedWorkloadInfo(name="dev-natural-batch32", n_prompts=32, max_new_tokens=256, ignore_eos=False,
                           workload_digest="a", batch=32)
    rows = [SpeedRow(workload=wl.name, engine=engine, tokens_per_pass=1.0, tok_per_s=_stat(*values),
                     latency_ms=_stat(1.0, 1.0, 1.0))
            for engine, values in (("candidate", cand), ("parent", parent), ("vanilla", vanilla))]
    return SpeedTable(device="cuda", reps=3, method="m", workloads=[wl], rows=rows,
                      parent_is_vanilla=parent_is_vanilla)


# Vanilla E0's batched passes in one H100 gate (every repetition times other prompts; their natural lengths alone
# moved every engine alike: the fixed-length workload's range in that gate was 641.6-641.9 tok/s).
VANILLA_PASSES = (7420.0, 8113.0, 7537.0)


def test_a_regression_in_every_repetition_does_not_hide_in_the_spread_the_prompts_make():
    """The parent 1.2x vanilla in each repetition, the candidate 8 % slower than the parent in each: the raw ranges
    overlapped (what the repetitions' prompts did to both), and the candidate was retained."""
    parent = tuple(1.2 * v for v in VANILLA_PASSES)
    cand = tuple(0.92 * p for p in parent)
    lines = slower_than_parent(_batched(cand, parent, VANILLA_PASSES), "throughput")
    assert len(lines) == 1 and lines[0].startswith("slower than its parent on dev-natural-batch32"), lines
    assert "per repetition 1.104–1.104x vanilla's tok/s on the same prompts, against 1.200–1.200x" in lines[0]
    # the machine's own noise still counts: a candidate at the parent's speed within it is not slower
    even = tuple(p * f for p, f in zip(parent, (1.003, 0.996, 1.001)))
    jitter = tuple(p * f for p, f in zip(parent, (0.998, 1.002, 1.0)))
    assert slower_than_parent(_batched(even, jitter, VANILLA_PASSES), "throughput") == []
