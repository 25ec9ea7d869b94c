"""What a post-validation run measures, validated before any work starts."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..engine_import import ENGINE_TEMPLATE
from ..validation import describe_errors


class PostValError(ValueError):
    """Bad input to post-validation (engine dir, model, sizes, prepared data); the message says what to fix."""


# `--quick`: a smoke run that finishes in about a minute on a CPU with a small model. Values the caller sets
# explicitly win over these.
QUICK: dict[str, Any] = {
    "gsm8k_items": 8,
    "retrieval_items": 9,  # one per length bucket
    "speed_requests": 4,
    "fixed_single_requests": 2,
    "dev_requests": 4,
    "gsm8k_max_new_tokens": 64,
    "natural_max_new_tokens": 64,
    "fixed_new_tokens": 64,
    "heldout_max_output_len": 64,
    "max_batch_size": 8,  # KV cache = batch x context: keep it small on a CPU
    "max_seq_len": 2048,
    "cpu_threads": 1,  # stable CPU timings on a shared machine (see cpu_threads)
}

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class PostValConfig(BaseModel):
    """One post-validation run: a retained engine against vanilla E0, same model, same process layout."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine_dir: Path  # the engine under test (a directory holding package `engine`)
    model: str  # registry name or HF model directory (seis.models.resolve_model)
    out_dir: Path = Path("runs/postval")
    vanilla_dir: Path = ENGINE_TEMPLATE  # the reference: E0
    prepared_dir: Path | None = None  # default: data/prepared

    # Engine options (the only ones the contract lets the evaluator set); identical for both engines.
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = Field(32, ge=1)
    max_seq_len: int | None = Field(None, ge=16)  # default: what the longest request needs, within the model's
    # Intra-op threads of each engine process (OMP_NUM_THREADS). On a shared CPU, 1 keeps timings stable:
    # multi-threaded decode steps stall whenever another process holds one of the cores.
    cpu_threads: int | None = Field(None, ge=1)
    # Off: an engine that speculates decodes without drafts (the contract's `speculation` option; others ignore it),
    # so a run can report its speed with and without speculation.
    speculation: bool = True

    # Sizes: 0 skips that measurement.
    gsm8k_items: int = Field(660, ge=0)
    retrieval_items: int = Field(270, ge=0)
    speed_requests: int = Field(100, ge=0)
    # Fixed-length single-request timing uses the first N speed prompts: 100 x 256 tokens x reps x 2 engines one
    # at a time would double the suite's wall time (natural-length single requests already give the latency
    # and single-stream numbers); the fixed-length batch timing uses all speed_requests.
    fixed_single_requests: int = Field(8, ge=0)
    dev_requests: int = Field(8, ge=0)  # the gate's dev speed size
    # Sizes are per repetition: every repetition of every workload times prompts its engine process has not seen
    # (see plan.speed_plan); where a prompt pool is too small, the requests per repetition shrink (with a note).
    heldout: bool = True
    heldout_max_output_len: int | None = Field(None, ge=1)  # drop held-out shapes with longer outputs
    reps: int = Field(3, ge=1, le=100)
    # In every timed GSM8K prompt, before the question (None: drawn at random per run; recorded in the result), so
    # no engine can ship answers or a question's precomputed prefix for the public questions.
    prompt_nonce: str | None = Field(None, pattern=r"^[0-9a-f]{4,32}$")

    # Token budgets; None takes the prepared workloads' own values (manifest params).
    gsm8k_max_new_tokens: int | None = Field(None, ge=1)
    natural_max_new_tokens: int | None = Field(None, ge=1)
    fixed_new_tokens: int | None = Field(None, ge=1)
    retrieval_max_new_tokens: int | None = Field(None, ge=1)

    bandwidth_gbs: float | None = Field(None, gt=0)  # None: measure a large copy on the run's device
    flag_points: float = Field(3.0, gt=0)  # accuracy differences beyond +-this many points are flagged
    # Timed outputs are judged by the gate's timed checks (evaluator.timed), with these tolerances in place of the
    # gate's calibrated ones: a speed row is flagged (its figure not trustworthy) when fewer than timed_min_valid of
    # the candidate's timed tokens are vanilla's top-1 within timed_margin nats (vanilla scoring the candidate's own
    # outputs), when a stop lies beyond the stop margin, ...
    timed_min_valid: float = Field(0.97, ge=0, le=1)
    timed_margin: float = Field(0.3, ge=0)
    # ... when, at natural length (EOS on), the summed length of the outputs that agree with vanilla's up to a stop
    # is off vanilla's by more than this fraction, or when early ends clearly outnumber late ones.
    timed_length_tolerance: float = Field(0.10, ge=0)
    reported_dev_speedup: float | None = Field(None, gt=0)  # the gate's dev speedup, shown next to ours
    timeout_s: float = Field(3600.0, gt=0)  # per engine call (a 660-item batch on a CPU is slow)
    figures: bool = True
    quick: bool = False

    @model_validator(mode="before")
    @classmethod
    def _apply_quick(cls, data: Any) -> Any:
        if isinstance(data, dict):
            asked = "fixed_single_requests" in data
            if data.get("quick"):
                data = {**QUICK, **{k: v for k, v in data.items() if v is not None or k not in QUICK}}
            data = _fixed_of_the_speed_requests(data, asked)
        return data

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        if not _DEVICE.match(v):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {v!r}")
        return v

    @field_validator("model")
    @classmethod
    def _check_model(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("model name is empty")
        return v

    def engine_env(self) -> dict[str, str] | None:
        if self.cpu_threads is None:
            return None
        n = str(self.cpu_threads)
        return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}

    def engine_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"device": self.device, "dtype": self.dtype, "max_batch_size": self.max_batch_size,
                                "use_cuda_graphs": True, "seed": 0, "speculation": self.speculation}
        if self.max_seq_len is not None:
            opts["max_seq_len"] = self.max_seq_len
        return opts


def _fixed_of_the_speed_requests(data: dict, asked: bool) -> dict:
    """The fixed-length single requests are the first of the speed requests: asked for more, an error; left to the
    default (or --quick's), as many as there are."""
    speed = data.get("speed_requests", PostValConfig.model_fields["speed_requests"].default)
    fixed = data.get("fixed_single_requests", PostValConfig.model_fields["fixed_single_requests"].default)
    if not (isinstance(speed, int) and isinstance(fixed, int)) or fixed <= speed:
        return data  # a wrong type is the fields' own error
    if asked:
        raise ValueError(f"fixed_single_requests ({fixed}) are the first of the speed_requests ({speed}): ask for at "
                         f"most as many")
    return {**data, "fixed_single_requests": speed}


def make_config(**values: Any) -> PostValConfig:
    """PostValConfig from keyword values, turning pydantic's errors into one readable PostValError."""
    try:
        return PostValConfig(**values)
    except ValidationError as exc:
        raise PostValError("invalid post-validation settings: " + describe_errors(
            exc, lambda field: f"{field} (--{field.replace('_', '-')})", with_input=True)) from None
