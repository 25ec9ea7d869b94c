"""The evaluator: runs a candidate engine directory in its own isolated process, checks it against the vanilla
reference on dev and held-out workloads, measures dev speed, and returns a schema-validated verdict.

    from seis.evaluator import GateConfig, run_gate
    result = run_gate(GateConfig(candidate="workspace/", model="tiny-qwen3"))
    result.verdict, result.failed_checks, result.speed
"""
from .errors import GateInputError, GateInterrupted, HostFailure, ReferenceFailure
from .gate import run_dev_benchmark, run_gate
from .gate_config import CheckSizes, GateConfig, GateThresholds, IsolationConfig, SpeedConfig
from .report import render_dev_benchmark, render_gate, render_gate_for_agents
from .schema import CheckResult, DevBenchmarkResult, GateResult

__all__ = ["CheckResult", "CheckSizes", "DevBenchmarkResult", "GateConfig", "GateInputError", "GateInterrupted",
           "GateResult", "GateThresholds", "HostFailure", "IsolationConfig", "ReferenceFailure", "SpeedConfig",
           "render_dev_benchmark", "render_gate", "render_gate_for_agents", "run_dev_benchmark", "run_gate"]
