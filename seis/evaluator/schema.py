"""The gate's JSON result (and the dev benchmark's): pydantic models, validated when built and when read back."""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CheckResult(_Model):
    """One named correctness check: passes iff lower <= value <= upper (bounds that are None don't apply)."""

    name: str
    value: float | None            # None: could not be computed (then it fails, unless `skipped`)
    lower: float | None = None
    upper: float | None = None
    passed: bool
    skipped: bool = False           # nothing to check (e.g. the reference never produced an EOS): passes
    detail: str = ""
    extra: dict[str, float] = Field(default_factory=dict)

    @property
    def threshold(self) -> str:
        if self.lower is not None and self.upper is not None:
            return f"in [{self.lower:.4g}, {self.upper:.4g}]"
        if self.lower is not None:
            return f">= {self.lower:.4g}"
        if self.upper is not None:
            return f"<= {self.upper:.4g}"
        return "-"

    @classmethod
    def bounded(cls, name: str, value: float | None, lower: float | None = None, upper: float | None = None,
                detail: str = "", extra: dict[str, float] | None = None) -> "CheckResult":
        ok = value is not None and math.isfinite(value) and (lower is None or value >= lower) \
            and (upper is None or value <= upper)
        if value is not None and not math.isfinite(value):
            detail = f"not finite ({value}); " + detail
            value = None
        return cls(name=name, value=value, lower=lower, upper=upper, passed=ok, detail=detail.strip("; "),
                   extra=extra or {})

    @classmethod
    def rules(cls, name: str, problems: list[str], checked: int) -> "CheckResult":
        """A rule check: value = number of violations (must be 0)."""
        detail = "; ".join(problems[:3]) + (f"; … {len(problems) - 3} more" if len(problems) > 3 else "")
        return cls(name=name, value=float(len(problems)), upper=0.0, passed=not problems,
                   detail=detail or f"{checked} checked", extra={"checked": float(checked)})

    @classmethod
    def skip(cls, name: str, detail: str) -> "CheckResult":
        return cls(name=name, value=None, passed=True, skipped=True, detail=detail)


class Calibration(_Model):
    """The reference's own noise (reference vs reference under another batch composition) and the tolerances
    derived from it: tolerance = min(cap, max(floor, factor * noise))."""

    method: str
    noise: dict[str, float]
    tolerance: dict[str, float]
    positions: int                  # forced positions in the noise measurement
    requests: int                   # requests in the noise measurement


class Hashes(_Model):
    candidate_tree: str
    reference_tree: str
    parent_tree: str | None = None
    snapshots: dict[str, str] = Field(default_factory=dict)  # role -> snapshot-store id the tree came from
    trees_unchanged: bool = True    # every private copy hashed again after the engines were gone: identical
    evaluator_source: str
    workloads_manifest: str         # data/prepared/manifest.json digest
    workloads: str                  # the exact prompts, sampling and budgets this run used
    thresholds: str
    config: str


class IsolationRecord(_Model):
    snapshot: bool = True           # engines ran from private copies, validated and hashed before the run
    sandbox: str                    # the sandbox every engine process ran in (seis.sandbox)
    visible_paths: list[str]        # everything an engine process could see
    memory_limit: str
    memory_limit_bytes: int | None          # RLIMIT_AS of each engine process (CPU)
    sandbox_memory_bytes: int | None = None  # each engine sandbox's host memory as a whole (memory_limit says how)
    offline_env: dict[str, str]
    env_keys: list[str]             # names (not values) of the variables the engine processes received
    frozen_while_timed: bool = True  # the other engines' sandboxes were stopped while one was timed
    build_timeout_s: float
    call_timeout_s: float
    gate_timeout_s: float


class SpeedStat(_Model):
    median: float
    min: float
    max: float
    n: int
    values: list[float]

    @classmethod
    def of(cls, values: list[float]) -> "SpeedStat":
        from ..stats import summarize
        return cls(**summarize(values))


class SpeedWorkloadInfo(_Model):
    name: str
    n_prompts: int
    max_new_tokens: int
    ignore_eos: bool
    workload_digest: str
    batch: int = 1                  # requests per timed call (serving throughput when > 1)


class SpeedRow(_Model):
    workload: str
    engine: str                     # candidate | parent | vanilla
    tokens_per_pass: float
    tok_per_s: SpeedStat | None     # None: the engine failed during the measurement
    latency_ms: SpeedStat | None    # per-call latency (median over the calls of a pass; a batch is one call)
    vs_parent: float | None = None  # median over repetitions of paired per-pass tok/s ratios
    vs_vanilla: float | None = None
    error: str | None = None


class SpeedTable(_Model):
    device: str
    reps: int
    method: str
    workloads: list[SpeedWorkloadInfo]
    rows: list[SpeedRow]
    pinned_cpu: int | None = None  # the one CPU all engine processes shared while timed; None: unpinned
    prompt_nonce: str = ""         # in every timed prompt (unknowable to the engines in advance)
    gpu_idle_waits: int = 0        # timed requests that had to wait for the GPU to drain first
    gpu_idle_wait_s: float = 0.0
    gpu_never_idle: int = 0        # timed requests started on a GPU still busy after the wait's limit (unfair)
    # The parent's tree is vanilla's to the byte: one engine was timed, and its rows stand for both
    parent_is_vanilla: bool = False


class GateResult(_Model):
    schema_version: int = SCHEMA_VERSION
    verdict: Literal["pass", "fail"]
    failed_checks: list[str]
    checks: list[CheckResult]
    calibration: Calibration | None
    speed: SpeedTable | None
    hashes: Hashes
    isolation: IsolationRecord
    model: str
    model_dir: str
    device: str
    candidate: str
    reference: str
    parent: str | None
    engine_stats: dict[str, dict]
    counts: dict[str, int]
    timings_s: dict[str, float]
    started_at: str
    wall_s: float
    config: dict

    @model_validator(mode="after")
    def _consistent(self) -> "GateResult":
        failed = [c.name for c in self.checks if not c.passed]
        if failed != self.failed_checks:
            raise ValueError(f"failed_checks {self.failed_checks} do not match the checks ({failed})")
        if (self.verdict == "pass") != (not failed and bool(self.checks)):
            raise ValueError(f"verdict {self.verdict!r} contradicts the checks")
        return self


class DevBenchmarkResult(_Model):
    """What agents may see: the dev speed table only (no held-out data, no thresholds)."""

    schema_version: int = SCHEMA_VERSION
    candidate_tree: str
    model: str
    device: str
    speed: SpeedTable
    errors: list[str]
    wall_s: float
