"""The post-validation latency table: how many timings each figure stands on, and no interval wider than they allow."""
from __future__ import annotations

from seis.engine_import import ENGINE_TEMPLATE
from seis.postval.postval_config import PostValConfig
from seis.postval.result import PostValResult, SpeedComparison, SpeedMeasure, TimedCheck
from seis.postval.speed import latency_stats, length_stats, spread
from seis.postval.tables import latency_frame, latency_markdown


def _measure(engine: str, latencies: list[float]) -> SpeedMeasure:
    return SpeedMeasure(engine=engine, tok_per_s=spread([10.0] * 3), wall_s=spread([1.0] * 3), tokens=[16] * 3,
                        output_lengths=length_stats([16] * len(latencies), ["length"] * len(latencies)),
                        latency=latency_stats(latencies), request_new_tokens=[16] * len(latencies),
                        request_latency_s=latencies)


def _result(requests: int, reps: int = 3) -> PostValResult:
    lat = [0.1 * (i + 1) for i in range(requests * reps)]
    comp = SpeedComparison(workload="fixed-16", kind="test", mode="single", requests=requests, max_new_tokens=16,
                           ignore_eos=True, prompt_len_mean=50.0, candidate=_measure("candidate", lat),
                           vanilla=_measure("vanilla", lat), speedup=spread([1.0] * reps), requested=requests,
                           timed=TimedCheck(requests=requests * reps, identical_frac=1.0, valid_frac=1.0,
                                            first_divergence_mean=16.0, length_ratio=1.0, missing=0, over_length=0,
                                            flagged=False))
    config = PostValConfig(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", reps=reps)
    return PostValResult(config=config, model_dir="m", started_at="t", wall_s=1.0, context_tokens=512,
                         vanilla_context_tokens=512, engines={}, device="cpu", accuracy=[], retrieval_buckets=[],
                         speed=[comp], workloads=[], bandwidth=None, energy_available=False, energy_note="",
                         flags=[], notes=[], items=[])


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _header(md: str) -> list[str]:
    return _cells(next(line for line in md.splitlines() if line.startswith("| workload")))


def _row(md: str, engine: str) -> list[str]:
    return next(c for c in map(_cells, md.splitlines()) if c[:2] == ["fixed-16", engine])


def test_latency_rows_count_every_timing_they_summarize() -> None:
    """The statistics are over every request of every repetition: 2 requests x 3 repetitions are 6 timings, and the
    table said 2."""
    r = _result(requests=2)
    frame = latency_frame(r)
    assert list(frame["samples"]) == [6, 6]
    header = _header(latency_markdown(r))
    assert _row(latency_markdown(r), "vanilla")[header.index("timings")] == "6 (2 × 3 reps)"


def test_a_percentile_interval_needs_timings_beyond_it() -> None:
    """A 10-90 % interval of 6 timings is the interpolated min and max, stated as a percentile: shown only from 10
    timings on (25-75 % from 4), and left empty in the parquet below that."""
    few, many = _result(requests=2), _result(requests=4)          # 6 and 12 timings
    md = latency_markdown(few)
    header = _header(md)
    row = _row(md, "candidate")
    assert row[header.index("10–90 % s")] == "– (under 10 timings)"
    assert row[header.index("25–75 % s")] != "– (under 4 timings)"         # 6 timings are enough for quartiles
    assert row[header.index("10–90 %")] == "– (under 10 timings)"            # output lengths: the same timings
    assert latency_frame(few)[["latency_p10_s", "latency_p90_s"]].isna().all().all()
    assert latency_frame(few)["latency_p25_s"].notna().all()
    row = _row(latency_markdown(many), "candidate")
    assert "under" not in row[header.index("10–90 % s")]
    assert latency_frame(many)["latency_p90_s"].notna().all()
    tiny = _result(requests=1)                                     # 3 timings: no quartiles either
    assert _row(latency_markdown(tiny), "candidate")[header.index("25–75 % s")] == "– (under 4 timings)"
