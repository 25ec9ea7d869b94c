"""Speed workload definitions as frozen pydantic data, so the evaluator can hash exactly what it ran.

Dev workloads are what agents may benchmark (GSM8K dev prompts, single request). Held-out shapes use
other prompt/output lengths and random token ids, and are only ever run by the evaluator.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from seis.workloads.common import model_digest, rand_below, rng_for
from seis.workloads.params import DevParams, HeldOutParams


class _Hashable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def digest(self) -> str:
        """sha256 of the canonical JSON: the identity of this workload definition."""
        return model_digest(self)


class DevWorkload(_Hashable):
    """Single-request decoding over the GSM8K dev prompts (chat template applied by the evaluator)."""

    name: str
    dataset: str = "gsm8k"
    split: str = "dev"
    item_ids: tuple[str, ...]  # dev items, in order
    batch_size: int = Field(1, ge=1)  # one request at a time: latency, not throughput
    max_new_tokens: int = Field(ge=1)
    ignore_eos: bool  # False: natural length (stop at EOS); True: exactly max_new_tokens
    include_prefill: bool = True  # timings cover prefill + decode
    temperature: float = 0.0  # greedy

    @property
    def min_new_tokens(self) -> int:
        return self.max_new_tokens if self.ignore_eos else 0


class HeldOutShape(_Hashable):
    prompt_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    token_ids: tuple[int, ...]  # the prompt itself: prompt_len ids, no chat template, no BOS added

    @model_validator(mode="after")
    def _check(self) -> HeldOutShape:
        if len(self.token_ids) != self.prompt_len:
            raise ValueError(f"shape {self.prompt_len}x{self.output_len}: {len(self.token_ids)} token ids")
        return self


class HeldOutShapes(_Hashable):
    """Every (prompt_len, output_len) pair; exact output lengths (ignore_eos), one request at a time."""

    seed: int
    token_id_low: int
    token_id_high: int
    ignore_eos: bool = True
    batch_size: int = 1
    shapes: tuple[HeldOutShape, ...]


def dev_workloads(params: DevParams, dev_item_ids: list[str]) -> tuple[DevWorkload, DevWorkload]:
    """The natural-length workload and its fixed-length variant (same prompts)."""
    ids = tuple(dev_item_ids)
    return (
        DevWorkload(name="dev-natural", item_ids=ids, max_new_tokens=params.max_new_tokens, ignore_eos=False),
        DevWorkload(name=f"dev-fixed{params.fixed_new_tokens}", item_ids=ids,
                    max_new_tokens=params.fixed_new_tokens, ignore_eos=True),
    )


def build_heldout_shapes(params: HeldOutParams, seed: int) -> HeldOutShapes:
    """Each shape gets its own id stream, so no prompt is a prefix of another (no free prefix-cache hits)."""
    span = params.token_id_high - params.token_id_low
    shapes = []
    for p in params.prompt_lens:
        for o in params.output_lens:
            rng = rng_for(seed, "heldout", p, o)
            ids = tuple(params.token_id_low + rand_below(rng, span) for _ in range(p))
            shapes.append(HeldOutShape(prompt_len=p, output_len=o, token_ids=ids))
    return HeldOutShapes(seed=seed, token_id_low=params.token_id_low, token_id_high=params.token_id_high,
                         shapes=tuple(shapes))
