"""The run directory: config, per-session files, and the summary table.

    runs/<run-id>/
      config.json  status.json  vanilla.json  summary.parquet  summary.md  best.json  timeline.md
      flow_runs.json  (every attempt's Prefect flow run: id, name, server; a resumed one names the one it continues)
      figures/chain_speedups.png  figures/timeline.png
      postval/  (with post_validate: the best retained engine against vanilla; tables, figures, metrics)
      chains/<chain>/<session>/  workspace/  workspace.diff  report.md  gate.json  agent.json  transcript.jsonl
                                 (gate-reused.json instead of gate.json: the session that judged the same candidate)
      verdicts/<key>.json        which session judged which candidate (seis.session.reuse)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..files import set_aside, write_atomic
from .status import RunStatus, read_status, write_status

ATTEMPTS_FILE = "flow_runs.json"
OUTCOME_FILE = "outcome.json"       # a finished session's outcome, written last (seis.session.resume)
SUMMARY_COLUMNS = ["chain", "session", "parent_snapshot", "snapshot", "retained", "verdict", "reasons",
                   "dev_speedup_vs_vanilla", "dev_speedup_vs_parent", "synced_from", "agent", "applied", "adopted",
                   "tokens_in", "tokens_out", "cost_usd", "wall_s"]


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def create(cls, root: Path, config_json: str) -> "RunDir":
        """A new run directory with its config. The config is written only if none is there: another run started in
        the same directory can pass the check that it is empty at the same moment, and the one that wrote second
        replaced the config of the one that then held the directory (ValueError; that run's config stays)."""
        root.mkdir(parents=True, exist_ok=True)
        try:
            with (root / "config.json").open("x") as f:
                f.write(config_json + "\n")
        except FileExistsError:
            raise ValueError(f"output dir {root} holds a run (another run started in it at the same time); choose "
                             f"a new output dir") from None
        return cls(root)

    @classmethod
    def open(cls, root: Path) -> "RunDir":
        """An existing run directory (to resume): it must hold the run's recorded config.json."""
        root = Path(root).expanduser().resolve()
        if not (root / "config.json").is_file():
            raise ValueError(f"{root} is not a SEIS run directory (no config.json): nothing to resume")
        return cls(root)

    def recorded_config_json(self) -> str:
        return (self.root / "config.json").read_text()

    # ---- the run's vanilla engine: pinned, so that a resumed run judges against the same E0 -------------------
    def recorded_vanilla(self) -> str | None:
        try:
            return json.loads((self.root / "vanilla.json").read_text())["snapshot"]
        except (OSError, ValueError, KeyError):
            return None

    def record_vanilla(self, snapshot: str) -> None:
        write_atomic(self.root / "vanilla.json", json.dumps({"snapshot": snapshot}) + "\n")

    # ---- status: a half-finished run says so ------------------------------------------------------------------
    def status(self) -> RunStatus | None:
        return read_status(self.root)

    def set_status(self, state: str, *, flow_run_id: str, **values) -> RunStatus:
        return write_status(self.root, state, flow_run_id=flow_run_id, **values)

    # ---- attempts: the flow runs that worked in this directory, oldest first --------------------------------
    def attempts(self) -> list[dict]:
        try:
            attempts = json.loads((self.root / ATTEMPTS_FILE).read_text())
        except (OSError, ValueError):
            return []
        return [a for a in attempts if isinstance(a, dict) and a.get("flow_run_id")] if isinstance(attempts, list) \
            else []

    def record_attempt(self, attempt: dict) -> None:
        """Append one attempt (written whole and atomically: only the flow holding the run's lock writes it). A
        record that cannot be read is kept beside it (files.set_aside), not overwritten."""
        path = self.root / ATTEMPTS_FILE
        earlier = self.attempts()
        if not earlier and path.is_file() and path.read_text(errors="replace").strip() not in ("", "[]"):
            set_aside(path)
        write_atomic(path, json.dumps([*earlier, attempt], indent=2) + "\n")

    def lock(self):
        """Held by the one flow working in this directory (released by the OS if its process dies)."""
        from ..store import FileLock
        return FileLock(self.root / ".run.lock", timeout_s=0)

    def session_dir(self, chain: str, session: int) -> Path:
        return self.root / "chains" / chain / f"{session:03d}"

    def sessions_recorded(self) -> int:
        """Sessions whose outcome is on disk (what a resume keeps, if they still follow from their parents)."""
        return sum(1 for _ in (self.root / "chains").glob(f"*/*/{OUTCOME_FILE}"))

    def write_summary(self, rows: list[dict]) -> Path:
        import pandas as pd

        df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS).sort_values(["session", "chain"], kind="stable")
        df.to_parquet(self.root / "summary.parquet", index=False)
        (self.root / "summary.md").write_text(summary_markdown(df) + "\n")
        return self.root / "summary.parquet"

    def write_chain_figure(self) -> Path:
        """Retained dev speedup along each chain, rejected candidates and sync points marked."""
        import pandas as pd

        from ..postval import plot_chain_speedups
        path = self.root / "figures" / "chain_speedups.png"
        path.parent.mkdir(exist_ok=True)
        df = pd.read_parquet(self.root / "summary.parquet")
        # A fan-in before session s hands over each peer's engine as it stood after session s - 1.
        df["synced_from"] = [f"{peers.split(',')[0]}/{s - 1}" if peers else None
                             for peers, s in zip(df["synced_from"], df["session"])]
        plot_chain_speedups(df, path)
        return path

    def write_timeline(self) -> Path:
        """When and where each gate ran: timeline.md and figures/timeline.png."""
        from ..postval import plot_gate_timeline
        from .timeline import read_gates, timeline_markdown
        spans, unreadable = read_gates(self.root)
        (self.root / "timeline.md").write_text(timeline_markdown(spans, unreadable) + "\n")
        path = self.root / "figures" / "timeline.png"
        plot_gate_timeline(spans, path)
        return path

    def write_best(self, best: dict | None) -> None:
        write_atomic(self.root / "best.json", json.dumps(best, indent=2) + "\n")


def run_root_of(session_dir: Path) -> Path | None:
    """The run directory a session directory (`<root>/chains/<chain>/<session>`) belongs to; None for a path not
    laid out so."""
    parts = Path(session_dir).parts
    if len(parts) < 4 or parts[-3] != "chains":
        return None
    return Path(session_dir).parents[2]


def summary_markdown(df) -> str:
    shown = df[["chain", "session", "verdict", "retained", "dev_speedup_vs_vanilla", "dev_speedup_vs_parent",
                "applied", "adopted", "synced_from", "snapshot", "reasons", "wall_s"]]
    from ..tables import frame_markdown
    shown = shown.assign(reasons=shown["reasons"].astype(str))
    # speedups to 3 decimals, wall seconds to 1 (a per-column format)
    floatfmt = [{"dev_speedup_vs_vanilla": ".3f", "dev_speedup_vs_parent": ".3f", "wall_s": ".1f"}.get(c, "g")
                for c in shown.columns]
    return frame_markdown(shown, floatfmt)
