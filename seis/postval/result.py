"""The post-validation result: pydantic models, written as postval.json."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..evaluator.schema import CheckResult
from .postval_config import PostValConfig

EngineName = Literal["candidate", "vanilla"]
ENGINES: tuple[EngineName, EngineName] = ("candidate", "vanilla")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ItemOutcome(_Model):
    """One prompt of an accuracy task answered by one engine."""
    task: Literal["gsm8k", "retrieval"]
    id: str
    engine: EngineName
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    output_sha: str  # sha256[:16] of the output token ids: determinism checks without storing every id
    text: str
    extracted: str | None  # GSM8K: the extracted number; retrieval: None
    gold: str
    correct: bool
    bucket: int | None = None  # retrieval length bucket
    # False: a correct answer vanilla, scoring the candidate's output teacher-forced, would not have produced
    # (accuracy.unbacked_answers): counted wrong
    backed: bool = True
    target_tokens: int | None = None


class AccuracySummary(_Model):
    task: str
    items: int  # scored items (after skipping)
    skipped: int  # prompts longer than the context
    candidate_acc: float | None  # percent
    vanilla_acc: float | None
    delta_points: float | None  # candidate - vanilla, percentage points
    candidate_only: int  # right only with the candidate (discordant pairs)
    vanilla_only: int
    identical_outputs: int  # items where both engines wrote exactly the same tokens
    flagged: bool  # |delta| beyond the flag threshold
    unbacked: int = 0  # the candidate's correct answers that its model did not produce: counted wrong, flagged


class BucketAccuracy(_Model):
    bucket: int
    target_tokens: int
    items: int
    skipped: int
    candidate_acc: float | None
    vanilla_acc: float | None


class Spread(_Model):
    """Median of repetitions with min and max (the values themselves kept for audits)."""
    median: float
    min: float
    max: float
    values: list[float]


class LatencyStats(_Model):
    n: int
    mean: float
    median: float
    p10: float
    p25: float
    p75: float
    p90: float


class LengthStats(_Model):
    n: int
    mean: float
    median: float
    min: int
    max: int
    p10: float
    p90: float
    capped_frac: float  # finish_reason == "length"


class SpeedMeasure(_Model):
    engine: EngineName
    tok_per_s: Spread
    wall_s: Spread
    tokens: list[int]  # generated tokens counted per repetition (each reply's first max_new_tokens, see speed.py)
    output_lengths: LengthStats  # over every timed request of every repetition
    latency: LatencyStats | None = None  # single-request mode: over every timed request, s
    mean_context: float | None = None  # token-weighted mean context during decode
    bound_tok_per_s: float | None = None  # bandwidth bound, single-request rows only
    energy_j_per_token: Spread | None = None
    request_new_tokens: list[int] = []  # single-request mode: per request, repetitions one after another
    request_latency_s: list[float] = []  # single-request mode: per request, same order


class TimedCheck(_Model):
    """The candidate's timed outputs against vanilla's for the same requests, over every repetition (greedy):
    a speed figure is only as good as the outputs it was measured on."""
    requests: int  # timed requests compared (all repetitions)
    identical_frac: float  # candidate output token-identical to vanilla's
    valid_frac: float  # candidate timed tokens that vanilla, teacher-forced, puts within the margin of its top-1
    first_divergence_mean: float  # mean index of the first differing token (a prefix: the shorter length)
    length_ratio: float  # summed candidate / vanilla output length, every request (reported; see checks)
    missing: int  # requests without exactly one well-formed reply
    over_length: int  # outputs longer than max_new_tokens (counted only up to max_new_tokens)
    flagged: bool
    reasons: list[str] = []
    checks: list[CheckResult] = []  # the gate's timed checks on this set (evaluator.timed): what decided the flag


class PromptPool(_Model):
    """Where the timed prompts of one source came from: every prompt is timed at most once per engine process."""
    name: str  # "gsm8k-test", "gsm8k-dev", "heldout-p32-o64" (rotations of the shape's prompt, nonce-shifted)
    available: int  # distinct prompts that fit the context
    needed: int  # distinct prompts the requested sizes need (all repetitions), warm-up included
    timed: int  # prompts timed (all repetitions)
    warmup: int  # prompts reserved for warm-up, never timed
    shrunk: bool  # requests per repetition lowered to what the pool offers
    repeated: int  # timed prompts that the process had already seen (0 unless the pool cannot even give one each)


class SpeedComparison(_Model):
    workload: str  # "natural-256", "fixed-256", "dev-natural", "heldout-p512-o64", ...
    kind: Literal["test", "dev", "heldout"]
    mode: Literal["single", "batch"]
    requests: int
    max_new_tokens: int
    ignore_eos: bool
    prompt_len_mean: float
    candidate: SpeedMeasure
    vanilla: SpeedMeasure
    speedup: Spread  # per-repetition candidate/vanilla throughput ratio (repetitions are paired)
    requested: int = 0  # requests per repetition asked for (requests: what the prompt pool allowed)
    prompt_ids: list[list[str]] = []  # per repetition: the timed prompts (item ids; held-out: rotation)
    distinct_prompts: bool = True  # no timed prompt of this row was seen before by its engine process
    timed: TimedCheck | None = None  # the candidate's timed outputs against vanilla's
    gpu_busy_passes: int = 0  # timed passes that started on a GPU still running another engine's work (unfair)

    @property
    def timed_flagged(self) -> bool:
        return self.timed is not None and self.timed.flagged


class BandwidthInfo(_Model):
    bytes_per_s: float
    source: str  # "configured", "measured cpu copy", "measured cuda device-to-device copy"
    weight_bytes: dict[str, int]  # per engine, at its run dtype
    kv_bytes_per_token: dict[str, int]  # per engine: K+V bytes of one context token over all layers
    dtype: dict[str, str]


class EngineInfo(_Model):
    engine_dir: str
    stats: dict  # as the engine reported it (untrusted: shown, not relied on); "after": its last stats()
    build_s: dict[str, float] = {}  # phase ("accuracy", "speed") -> seconds to start and build its process


class PostValResult(_Model):
    config: PostValConfig
    model_dir: str
    started_at: str
    wall_s: float
    context_tokens: int  # what both engines can serve (min of their max_seq_len)
    # vanilla's own max_seq_len (trusted): above context_tokens, the candidate's word cut what was measured (a flag)
    vanilla_context_tokens: int = 0
    engines: dict[str, EngineInfo]
    device: str
    device_name: str = ""   # the GPU's name, or "cpu": what a figure names as its device
    commit: str = ""        # the checkout's commit ("+changes" where it differed: provenance.source_commit)
    weights: str = ""       # "random weights", "real weights" or "local model"
    accuracy: list[AccuracySummary]
    retrieval_buckets: list[BucketAccuracy]
    speed: list[SpeedComparison]  # natural-length and fixed on GSM8K test prompts, single + batch
    workloads: list[SpeedComparison]  # dev workloads and held-out shapes, single request
    bandwidth: BandwidthInfo | None
    energy_available: bool
    energy_note: str
    flags: list[str]  # human-readable flags: a context the candidate cut, accuracy beyond ±flag_points, then timed
    # outputs unlike vanilla's
    notes: list[str]  # skips, remapped ids, anything a reader must know
    items: list[ItemOutcome]
    prompt_pools: list[PromptPool] = []  # where the speed phase's timed prompts came from
    prompt_nonce: str = ""  # in every timed GSM8K prompt
    files: dict[str, str] = {}

    @property
    def context_flagged(self) -> bool:
        """The candidate said it serves a shorter context than vanilla (its stats: its word, nothing more)."""
        return self.context_tokens < self.vanilla_context_tokens

    @property
    def accuracy_flagged(self) -> bool:
        return any(a.flagged or a.unbacked for a in self.accuracy)

    @property
    def timed_flagged(self) -> bool:
        """Some speed row's timed outputs disagree with vanilla's beyond the tolerances."""
        return any(c.timed_flagged for c in self.speed + self.workloads)

    def accuracy_of(self, task: str) -> AccuracySummary | None:
        return next((a for a in self.accuracy if a.task == task), None)


def context_flag(context: int, vanilla_context: int) -> str:
    """The flag of a run whose context the candidate's own max_seq_len cut below vanilla's: a candidate may say it
    serves 1 token, and every prompt would be skipped on both engines, with nothing else to flag."""
    return (f"the candidate says it serves a context of {context} tokens, vanilla {vanilla_context}: every prompt "
            f"longer than {context} tokens was measured on neither engine")
