"""Post-validation: judge a retained engine against vanilla E0 (same weights, same run), outside the agents'
feedback — GSM8K and retrieval accuracy, natural-length and fixed-length speed, latency, held-out shapes,
the bandwidth bound, energy; results as postval.json, tables (md + parquet) and figures (png).

    from seis.postval import make_config, run_post_validation
    result = run_post_validation(make_config(engine_dir="path/to/engine", model="tiny-qwen3", quick=True))

Heavy libraries (torch, pandas, matplotlib) are imported only where they are used.
"""
from .figures import plot_chain_speedups, plot_gate_timeline
from .plan import check_model, fetch_snapshot, prepare_plan, speed_plan
from .postval_config import QUICK, PostValConfig, PostValError, make_config
from .result import (
    AccuracySummary,
    ItemOutcome,
    PostValResult,
    PromptPool,
    SpeedComparison,
    SpeedMeasure,
    TimedCheck,
)
from .run import run_post_validation, write_outputs

__all__ = [
    "QUICK",
    "AccuracySummary",
    "ItemOutcome",
    "PostValConfig",
    "PostValError",
    "PostValResult",
    "PromptPool",
    "SpeedComparison",
    "SpeedMeasure",
    "TimedCheck",
    "check_model",
    "fetch_snapshot",
    "make_config",
    "plot_chain_speedups",
    "plot_gate_timeline",
    "prepare_plan",
    "run_post_validation",
    "speed_plan",
    "write_outputs",
]
