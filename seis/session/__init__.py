"""One SEIS session as plain library steps (prepare -> edit -> gate -> decide -> report -> snapshot), the protocol
rules (parent, peers, fan-in) and their round loop, resume and the run-level bookkeeping. Prefect wraps these in
tasks/ and flows/; nothing here imports Prefect."""
from .judge import Judgement, judge, needs_gate, not_gated
from .lineage import ChainState, fan_in, pick_best
from .protocol import initial_states, session_spec, upstream_is_vanilla
from .rounds import Rounds, SessionRunner, run_rounds
from .rundir import RunDir, SUMMARY_COLUMNS
from .spec import SessionOutcome, SessionResult, SessionSpec
from .steps import (Retention, decide, gate_workspace, make_agent, prepare, record, run_agent, snapshot_if_retained,
                    snapshot_or_keep_parent)
