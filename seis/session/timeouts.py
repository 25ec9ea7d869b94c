"""Outer time limits of a session's steps: a safety net over the limits the steps keep themselves (the gate's
deadline, the agent's wall clock), so that a hung step ends as a timed-out session instead of holding the run."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..run_config import RunConfig

MARGIN_S = 600.0
OFFLINE_AGENT_S = 3600.0
LLM_AGENT_S = 6 * 3600.0      # without agent_wall_s: above the agents' own default wall clocks (SDK 5 h, cli 1 h)


@dataclass(frozen=True)
class StepTimeouts:
    agent_s: float
    gate_s: float             # includes the wait for the GPU slot: every other chain's gate may come first


def step_timeouts(config: RunConfig) -> StepTimeouts:
    from .steps import gate_config

    gate = gate_config(config, candidate=Path("."))
    if config.agent_wall_s is not None:
        agent = config.agent_wall_s + MARGIN_S
    else:
        agent = OFFLINE_AGENT_S if config.agent == "offline" else LLM_AGENT_S
    return StepTimeouts(agent_s=agent, gate_s=config.chains * (gate.isolation.gate_timeout_s + MARGIN_S))
