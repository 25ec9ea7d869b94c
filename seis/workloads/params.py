"""Workload parameters: one pydantic model mirroring the `workloads:` section of params.yaml.

The defaults here equal params.yaml, so the library works without the file; DVC tracks the file so a
change of any value re-runs the `prepare-workloads` stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from seis.workloads.common import PROJECT_ROOT, WorkloadDataError

DEFAULT_PARAMS_FILE = PROJECT_ROOT / "params.yaml"
PARAMS_SECTION = "workloads"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GSM8KParams(_Frozen):
    test_size: int = Field(660, ge=1)  # held-out accuracy split
    dev_size: int = Field(256, ge=1)  # the split agents may benchmark on (single and batched speed prompts)


class DevParams(_Frozen):
    max_new_tokens: int = Field(256, ge=1)  # natural-length cap (EOS on)
    fixed_new_tokens: int = Field(256, ge=1)  # fixed variant: ignore_eos, exactly this many


class RetrievalParams(_Frozen):
    items_per_bucket: int = Field(30, ge=1)
    n_buckets: int = Field(9, ge=1)
    # Context sizes are in approximate tokens (chars / chars_per_token); 4 chars per token over-counts the
    # common-word filler for BPE tokenizers, so the real token count stays below the target.
    min_tokens: int = Field(256, ge=16)
    max_tokens: int = Field(6144, ge=16)  # keep below the model's context (SmolLM2: 8192) minus the answer
    chars_per_token: float = Field(4.0, gt=0)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # needle position as a fraction of the context
    max_new_tokens: int = Field(32, ge=1)  # enough for a six-digit answer with some chatter

    @model_validator(mode="after")
    def _check(self) -> RetrievalParams:
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"retrieval.max_tokens ({self.max_tokens}) < min_tokens ({self.min_tokens})")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"retrieval.depths must be non-empty fractions in [0, 1], got {self.depths}")
        if self.items_per_bucket % len(self.depths):
            raise ValueError(
                f"retrieval.items_per_bucket ({self.items_per_bucket}) must be a multiple of "
                f"len(depths) ({len(self.depths)}) so every bucket covers every depth equally"
            )
        return self


class HeldOutParams(_Frozen):
    prompt_lens: tuple[int, ...] = (32, 512, 1500)
    output_lens: tuple[int, ...] = (64, 512)
    # Random token ids are drawn from [low, high): above the special tokens and inside any common vocab.
    token_id_low: int = Field(1000, ge=0)
    token_id_high: int = Field(30000, ge=1)

    @model_validator(mode="after")
    def _check(self) -> HeldOutParams:
        if self.token_id_high <= self.token_id_low:
            raise ValueError("heldout.token_id_high must be greater than token_id_low")
        if not self.prompt_lens or not self.output_lens or min(self.prompt_lens + self.output_lens) < 1:
            raise ValueError("heldout.prompt_lens and output_lens must be non-empty positive lengths")
        return self


class WorkloadParams(_Frozen):
    seed: int = 0
    gsm8k: GSM8KParams = GSM8KParams()
    dev: DevParams = DevParams()
    retrieval: RetrievalParams = RetrievalParams()
    heldout: HeldOutParams = HeldOutParams()

    @model_validator(mode="after")
    def _check(self) -> WorkloadParams:
        # Held-out shapes must not be the dev shape, or tuning on dev would tune on held-out.
        clash = {self.dev.max_new_tokens, self.dev.fixed_new_tokens} & set(self.heldout.output_lens)
        if clash:
            raise ValueError(f"heldout.output_lens {sorted(clash)} repeat a dev output length")
        return self


def load_params(path: str | Path | None = None) -> WorkloadParams:
    """Read the `workloads:` section of params.yaml (default: the project's, or built-in defaults if absent)."""
    if path is None:
        if not DEFAULT_PARAMS_FILE.is_file():
            return WorkloadParams()
        path = DEFAULT_PARAMS_FILE
    path = Path(path)
    if not path.is_file():
        raise WorkloadDataError(f"params file not found: {path}")
    import yaml  # lazy: only needed when reading the file

    try:
        doc: Any = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise WorkloadDataError(f"{path}: not valid YAML: {exc}") from exc
    section = doc.get(PARAMS_SECTION, {}) if isinstance(doc, dict) else None
    if not isinstance(section, dict):
        raise WorkloadDataError(f"{path}: `{PARAMS_SECTION}:` must be a mapping")
    try:
        return WorkloadParams.model_validate(section)
    except ValueError as exc:
        raise WorkloadDataError(f"{path}: invalid `{PARAMS_SECTION}` params: {exc}") from exc
