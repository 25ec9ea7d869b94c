"""The run's gate timeline: spans read from the session folders, the workers and devices they ran on, and how
many overlapped (at once overall, and per worker and device)."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from seis.postval import plot_gate_timeline
from seis.session.dispatch import SessionReply, WorkerInfo
from seis.session.timeline import gate_spans, most_at_once, most_at_once_per_lane, read_gates, timeline_markdown

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)


def _session(run: Path, chain: str, session: int, start_s: float, wall_s: float, worker: str | None = None,
             device: str = "", verdict: str = "pass") -> None:
    d = run / "chains" / chain / f"{session:03d}"
    d.mkdir(parents=True)
    started = (T0 + timedelta(seconds=start_s)).isoformat(timespec="milliseconds")
    (d / "gate.json").write_text(json.dumps({"started_at": started, "wall_s": wall_s, "verdict": verdict}))
    if worker is not None:
        SessionReply(chain=chain, session=session,
                     worker=WorkerInfo(worker=worker, host="h", pid=1, device=device)).save(d)


def test_two_workers_overlap_but_never_on_one_device(tmp_path):
    run = tmp_path / "run"
    _session(run, "c0", 0, 0.0, 100.0, "gpu0", "0")
    _session(run, "c1", 0, 0.5, 90.0, "gpu1", "1")
    _session(run, "c0", 1, 100.0, 80.0, "gpu0", "0")           # starts as c0/s0 ends: not an overlap
    _session(run, "c1", 1, 95.0, 85.0, "gpu1", "1", verdict="fail")
    (run / "chains" / "c1" / "002").mkdir()                     # an interrupted session: no gate.json
    spans = gate_spans(run)
    assert [(s.chain, s.session) for s in spans] == [("c0", 0), ("c1", 0), ("c1", 1), ("c0", 1)]
    assert most_at_once(spans) == 2
    assert most_at_once_per_lane(spans) == {"gpu0 (device 0)": 1, "gpu1 (device 1)": 1}
    text = timeline_markdown(spans)
    assert "4 gates" in text and "at most 2 at once" in text and "180.0 s of wall time" in text
    assert plot_gate_timeline(spans, tmp_path / "t.png") and (tmp_path / "t.png").stat().st_size > 0


def test_in_process_sessions_share_one_lane_and_an_overlap_there_shows(tmp_path):
    run = tmp_path / "run"
    _session(run, "c0", 0, 0.0, 50.0)
    _session(run, "c1", 0, 10.0, 50.0)                          # two gates at once on one device: visible
    spans = gate_spans(run)
    assert {s.lane for s in spans} == {"local"}
    assert most_at_once_per_lane(spans) == {"local": 2}
    assert timeline_markdown([]) == "no gate has run yet"


def test_a_gate_json_that_cannot_be_read_is_named_not_left_out_unsaid(tmp_path):
    """`seis timeline` showed 1 gate where the run had 2, one gate.json being corrupt, with no word of it."""
    run = tmp_path / "run"
    _session(run, "c0", 0, 0.0, 50.0)
    _session(run, "c0", 1, 50.0, 50.0)
    (run / "chains" / "c0" / "001" / "gate.json").write_text('{"started_at": "2026-12')
    (run / "chains" / "c0" / "002").mkdir()                     # no gate yet: nothing to say
    spans, unreadable = read_gates(run)
    assert [(s.chain, s.session) for s in spans] == [("c0", 0)] and unreadable == ["c0/001"]
    text = timeline_markdown(spans, unreadable)
    assert "1 gates" in text and text.endswith("1 gate.json unreadable, left out: c0/001")
    assert timeline_markdown([], unreadable).startswith("no readable gate")
