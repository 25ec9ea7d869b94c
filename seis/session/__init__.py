"""One SEIS session as plain library steps (prepare -> edit -> gate -> decide -> report -> snapshot), and the
run-level bookkeeping the protocols need. Prefect wraps these in tasks/ and flows/; nothing here imports Prefect."""
from .lineage import ChainState, fan_in, pick_best
from .rundir import RunDir, SUMMARY_COLUMNS
from .spec import SessionOutcome, SessionSpec
from .steps import decide, gate_workspace, make_agent, prepare, record, run_agent, snapshot_if_retained

__all__ = ["ChainState", "RunDir", "SUMMARY_COLUMNS", "SessionOutcome", "SessionSpec", "decide", "fan_in",
           "gate_workspace", "make_agent", "pick_best", "prepare", "record", "run_agent", "snapshot_if_retained"]
