"""When each session's gate ran, and where: the run's timeline (`seis timeline RUN_DIR`, `timeline.md` and
`figures/timeline.png` at the end of a run).

A gate is the part of a session that holds a device, so its span (from `gate.json`) is what shows whether
sessions ran at the same time on different GPUs and never two at once on one. The worker and its device come from
`worker.json` (dispatch=workers); an in-process session is on worker `local`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from .. import tables
from .worker_reply import SessionReply

LOCAL = "local"


@dataclass(frozen=True)
class GateSpan:
    chain: str
    session: int
    worker: str
    device: str           # CUDA_VISIBLE_DEVICES of the worker ('' when not pinned)
    start: datetime
    end: datetime
    verdict: str

    @property
    def lane(self) -> str:
        """Where it ran: the worker, and the device it owns."""
        return f"{self.worker} (device {self.device})" if self.device else self.worker


def gate_spans(run_root: Path) -> list[GateSpan]:
    """Every session of the run that has a readable gate.json, in start order."""
    return read_gates(run_root)[0]


def read_gates(run_root: Path) -> tuple[list[GateSpan], list[str]]:
    """The spans of every session that has a gate.json, in start order, and the sessions (chain/NNN) whose
    gate.json is there but unreadable, which the timeline names rather than leaving a gate out unsaid."""
    spans, unreadable = [], []
    for session_dir in sorted(Path(run_root).glob("chains/*/[0-9][0-9][0-9]")):
        path = session_dir / "gate.json"
        if not path.is_file():
            continue  # no gate yet
        try:
            gate = json.loads(path.read_text())
            start = datetime.fromisoformat(gate["started_at"])
            end = start + timedelta(seconds=float(gate["wall_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            unreadable.append(f"{session_dir.parent.name}/{session_dir.name}")
            continue
        reply = SessionReply.load(session_dir)
        worker, device = (reply.worker.worker, reply.worker.device) if reply is not None else (LOCAL, "")
        spans.append(GateSpan(session_dir.parent.name, int(session_dir.name), worker, device, start, end,
                              str(gate.get("verdict", ""))))
    return sorted(spans, key=lambda s: (s.start, s.chain)), unreadable


def most_at_once(spans: list[GateSpan]) -> int:
    """The largest number of gates running at the same moment (a span ending as another starts does not count)."""
    events = sorted([(s.start, 1) for s in spans] + [(s.end, -1) for s in spans], key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def most_at_once_per_lane(spans: list[GateSpan]) -> dict[str, int]:
    lanes: dict[str, list[GateSpan]] = {}
    for s in spans:
        lanes.setdefault(s.lane, []).append(s)
    return {lane: most_at_once(group) for lane, group in sorted(lanes.items())}


def timeline_markdown(spans: list[GateSpan], unreadable: list[str] | None = None) -> str:
    """The spans as a table (seconds from the first gate's start) and what overlapped; then the sessions whose
    gate.json could not be read."""
    import pandas as pd

    missing = (f"\n{len(unreadable)} gate.json unreadable, left out: {', '.join(unreadable)}" if unreadable else "")
    if not spans:
        return ("no readable gate" if unreadable else "no gate has run yet") + missing
    t0 = min(s.start for s in spans)
    df = pd.DataFrame([{"chain": s.chain, "session": s.session, "where": s.lane, "verdict": s.verdict,
                        "start_s": (s.start - t0).total_seconds(), "end_s": (s.end - t0).total_seconds(),
                        "gate_s": (s.end - s.start).total_seconds()} for s in spans])
    per_lane = most_at_once_per_lane(spans)
    wall = (max(s.end for s in spans) - t0).total_seconds()
    busy = sum((s.end - s.start).total_seconds() for s in spans)
    lines = [tables.frame_markdown(df, floatfmt=".1f"), "",
             f"{len(spans)} gates from {t0.isoformat(timespec='seconds')}: {wall:.1f} s of wall time, {busy:.1f} s "
             f"of gate time; at most {most_at_once(spans)} at once",
             "at most at once per worker and device: " + ", ".join(f"{k}: {v}" for k, v in per_lane.items())]
    return "\n".join(lines) + missing
