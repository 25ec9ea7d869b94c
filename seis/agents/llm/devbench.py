"""The dev benchmark an agent may run: the evaluator in a child process, returning only its dev speed table
(`render_dev_benchmark`): no correctness checks, thresholds or held-out data reach the agent.

    python -m seis.agents.llm.devbench --candidate WS --model tiny-qwen3 [--parent DIR] [--sizes quick]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class SubprocessDevBenchmark:
    """A DevBenchmark (workspace root -> table text) for make_agent: the parent is the session's parent tree."""

    model: str
    parent: Path | None = None
    device: str = "auto"
    sizes: str = "quick"          # smoke | quick | full, like RunConfig.gate
    seed: int = 0
    timeout_s: float = 1800.0

    def for_parent(self, parent: Path) -> "SubprocessDevBenchmark":
        """The same benchmark with the session's parent tree as the 'parent' row (unless one was set)."""
        return self if self.parent is not None else replace(self, parent=Path(parent))

    def argv(self, candidate: Path) -> list[str]:
        argv = [sys.executable, "-m", "seis.agents.llm.devbench", "--candidate", str(candidate), "--model",
                self.model, "--device", self.device, "--sizes", self.sizes, "--seed", str(self.seed)]
        return argv + (["--parent", str(self.parent)] if self.parent else [])

    def __call__(self, candidate: Path) -> str:
        try:
            out = subprocess.run(self.argv(candidate), cwd=PROJECT_ROOT, capture_output=True, text=True,
                                 timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            return f"dev benchmark: no result within {self.timeout_s:.0f} s"
        # stdout only: the table, or one line saying why there is none (stderr may hold evaluator internals).
        return out.stdout.strip() or f"dev benchmark failed (exit code {out.returncode}) without a message"


def _gate_config(args: argparse.Namespace):
    from ...evaluator import GateConfig, SpeedConfig
    values = dict(candidate=Path(args.candidate), model=args.model, device=args.device, seed=args.seed,
                  parent=Path(args.parent) if args.parent else None)
    if args.sizes == "full":
        return GateConfig(**values)
    if args.sizes == "smoke":
        values["speed"] = SpeedConfig(n_prompts=1, natural_max_new_tokens=8, fixed_max_new_tokens=8)
    return GateConfig.quick(**values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seis.agents.llm.devbench")
    p.add_argument("--candidate", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--parent")
    p.add_argument("--device", default="auto")
    p.add_argument("--sizes", choices=("smoke", "quick", "full"), default="quick")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from ...evaluator import run_dev_benchmark, render_dev_benchmark
    try:
        print(render_dev_benchmark(run_dev_benchmark(_gate_config(args))))
    except Exception as e:  # noqa: BLE001 - one line for the agent, not a traceback into evaluator code
        print(f"dev benchmark refused or failed: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
