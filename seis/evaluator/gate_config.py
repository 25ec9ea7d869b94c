"""What a gate run is told: inputs, sizes, isolation limits, and the thresholds (which live here, never in a
workspace). Everything is a frozen pydantic model so the whole configuration can be hashed and recorded."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..engine_import import ENGINE_TEMPLATE


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GateThresholds(_Frozen):
    """Each correctness metric is a deviation from the reference; its tolerance is calibrated as
    min(cap, max(floor, factor * noise)), where noise is the same deviation measured reference-vs-reference
    under a different batch composition. Floors let E0 vs a copy of E0 pass on CPU fp32 (noise ~0) and leave
    room for legitimate kernel changes on GPU bf16 (KL noise ~1e-3..1e-2, top-1 >= ~0.97); caps stop a noisy
    calibration from switching a check off."""

    top_k: int = Field(20, ge=2)  # KL is approximated on the reference's top-k (+ one "rest" bucket)
    # mean KL(ref || cand) over forced positions, nats
    kl_floor: float = Field(0.02, ge=0)
    kl_factor: float = Field(5.0, ge=1)
    kl_cap: float = Field(0.5, gt=0)
    # 1 - top-1 agreement
    top1_floor: float = Field(0.03, ge=0, le=1)
    top1_factor: float = Field(3.0, ge=1)
    top1_cap: float = Field(0.2, gt=0, le=1)
    # |ln(ppl_cand / ppl_ref)| over the forced tokens
    ppl_floor: float = Field(0.02, ge=0)
    ppl_factor: float = Field(5.0, ge=1)
    ppl_cap: float = Field(0.2, gt=0)
    # 1 - greedy token-exact rate (whole outputs identical to the reference's). Lenient on purpose: on GPU bf16 a
    # legitimate kernel change (E0 with torch instead of Triton kernels) matched only 64% of 64-token outputs
    # exactly while its KL was 0.0017; greedy_valid below is the strict behavioural check.
    greedy_floor: float = Field(0.5, ge=0, le=1)
    greedy_factor: float = Field(4.0, ge=1)
    greedy_cap: float = Field(0.9, gt=0, le=1)
    # greedy_valid: a generated greedy token counts as valid when the reference, teacher-forced on the candidate's
    # own output, puts it within this many nats of its top-1 (bf16 near-ties); its tolerance is top-1's
    greedy_margin: float = Field(0.3, ge=0)
    # timed outputs: every EOS the candidate stopped at must lie within min(stop_cap, max(stop_margin, stop_factor *
    # noise, greedy_margin * eos_scale)) nats of the reference's top-1 there; noise = the largest gap the
    # reference's teacher-forced scoring puts between its top-1 and the EOS at the reference's own timed stops;
    # eos_scale = how much more rounding moves an EOS-vs-top-1 gap than a gap between two ordinary tokens, from the
    # output rows' norms (evaluator/logit_scale.py: 3.24 on qwen3-0.6b-random, whose EOS row is 17.9 where the
    # median row is 4.0; 1.03 on SmolLM2). Wider than greedy_margin because one stop beyond it fails the gate,
    # while tokens are judged by rate. Observed on an H200 (qwen3-0.6b-random): an honest bf16 kernel change
    # stopped 0.38 nats below the top-1 once in 24 natural-length requests, exact speculative and fused-epilogue
    # engines 0.88 (3,275 of the other 3,276 tokens within 0.3). The reference's own noise was 0.00 in every gate of
    # that run (it agrees with itself). Stops that shorten outputs overall are also bounded by the natural-length
    # check.
    stop_margin: float = Field(0.75, ge=0)
    stop_factor: float = Field(1.5, ge=1)
    stop_cap: float = Field(1.5, gt=0)
    # timed natural-length outputs: fails when the candidate ends earlier than the reference on so many of the requests
    # whose lengths differ that a fair coin would do so with probability below this (one-sided sign test;
    # checks.early_ends). An honest engine fails it at this rate per natural workload; one that takes EOS at every
    # near-tie it meets fails once 8 of 8 (9 of 9 ...) differing requests end early.
    early_end_p: float = Field(0.005, gt=0, lt=1)
    # |sum(len_cand) / sum(len_ref) - 1| over natural-length (EOS on) requests
    length_floor: float = Field(0.10, ge=0)
    length_factor: float = Field(2.0, ge=1)
    length_cap: float = Field(0.5, gt=0)
    # 1 - rate of dev prompts giving identical tokens in the dev batch and inside the held-out batch (noise: the
    # larger of the reference's own dev-vs-mixed and batched-vs-alone mismatch)
    consistency_floor: float = Field(0.5, ge=0, le=1)
    consistency_factor: float = Field(4.0, ge=1)
    consistency_cap: float = Field(0.9, gt=0, le=1)
    # sampling.tv: mean total-variation distance between the empirical distribution of n seeded one-token samples
    # and the exact target distribution (the reference's next-token log-probs at temperature T, cut to top-k, then
    # top-p). Tolerance = min(cap, max(floor, factor * noise)), where noise is the reference's own TV on the same
    # requests and floor = tv_floor_factor * (the analytic expected TV of n exact samples) + tv_shift_factor *
    # (TV between the targets built from the reference's log-probs in two batch compositions: bf16 logit noise,
    # amplified by a low T). The cap stays below what an always-greedy engine scores (>= 1 - 0.5 by construction).
    tv_floor_factor: float = Field(1.5, ge=1)
    tv_shift_factor: float = Field(3.0, ge=0)
    tv_factor: float = Field(1.5, ge=1)
    tv_cap: float = Field(0.45, gt=0, le=1)
    # sampling.support: a sampled token outside the allowed top-k / top-p set is tolerated only when logit noise
    # of scale sigma (nats) could have put it inside (the union of the allowed sets of 256 seeded N(0, sigma^2)
    # perturbations of the reference's log-probs). sigma = min(cap, max(floor, factor * noise)), where noise is
    # the larger of the logit scale implied by the reference's own KL noise, sqrt(2 * kl), and its batched-vs-
    # alone log-prob difference on the sampling prompts (on GPU bf16 a legitimate kernel change moved a boundary
    # token by 0.125 nats; the reference's KL noise there was 0.0015, i.e. sqrt(2 kl) = 0.054).
    sampling_margin_floor: float = Field(0.05, ge=0)
    sampling_margin_factor: float = Field(2.0, ge=1)
    sampling_margin_cap: float = Field(0.25, ge=0)
    # sampling.sequence: the one-token requests above never reach a decode step, so an engine could sample the
    # first token exactly and every later one greedily, or from a lossy model. Seeded multi-token requests (the
    # same settings) are teacher-forced through the reference: their tokens' mean of log q(x) + H(q) is 0 for exact
    # sampling (checks.sequence_fit) and must stay within sequence_z standard errors plus a shift of min(cap,
    # max(floor, factor * the reference's own mean on its own sampled sequences)); a token outside its position's
    # allowed set fails it as sampling.support does.
    sequence_z: float = Field(4.5, gt=0)
    sequence_shift_floor: float = Field(0.05, ge=0)
    sequence_shift_factor: float = Field(1.5, ge=1)
    sequence_shift_cap: float = Field(0.25, gt=0)
    # sampling.seeded: "a seeded request gives the same tokens whatever else is in the batch". The sampled sequences
    # are asked again in reverse order (other batch positions, other neighbours); at most min(cap, max(floor,
    # factor * the reference's own mismatch)) of them may differ. A sampler that ignores seeds (one generator for
    # the batch, streams by batch position) matches almost none, as its samples still have the right distribution.
    seeded_floor: float = Field(0.25, ge=0, le=1)
    seeded_factor: float = Field(4.0, ge=1)
    seeded_cap: float = Field(0.5, gt=0, le=1)


class CheckSizes(_Frozen):
    """How many prompts the correctness checks use, and how long the outputs are."""

    n_dev: int = Field(8, ge=1)                 # GSM8K dev prompts (chat template)
    n_heldout_gsm8k: int = Field(8, ge=0)       # GSM8K held-out test-split prompts
    n_heldout_shapes: int = Field(6, ge=0)      # held-out token-id shapes (ids mapped into the vocab)
    max_new_tokens: int = Field(64, ge=2)       # greedy outputs of the check prompts
    tf_max_tokens: int = Field(64, ge=1)        # forced positions per prompt in teacher forcing
    # EOS probes: prompts whose reference greedy continuation reaches an EOS within probe_new_tokens (from outputs
    # that ended, else chat-formatted short-answer questions, else single-token prompts; correctness._mine_probes)
    n_eos_probes: int = Field(4, ge=0)
    probe_new_tokens: int = Field(4, ge=2)
    # Sampling semantics: the first n_sampling_prompts dev prompts, each at a temperature that makes the
    # reference's top-k top probability sampling_target_top, under (top_k, top_p=1) and (top_k, sampling_top_p):
    # n_samples seeded one-token requests per prompt and setting (0 prompts: no sampling checks).
    n_sampling_prompts: int = Field(2, ge=0)
    n_samples: int = Field(128, ge=32)
    sampling_top_k: int = Field(40, ge=2, le=63)   # < 64: the reference's top-64 makes the target exact
    sampling_top_p: float = Field(0.6, gt=0, lt=1)
    sampling_target_top: float = Field(0.3, gt=0, lt=1)
    # ... and per (prompt, setting) n_sequences seeded requests of min(sequence_tokens, max_new_tokens) sampled
    # tokens (ignore_eos), whose later tokens come from decode steps (sampling.sequence)
    n_sequences: int = Field(8, ge=0)
    sequence_tokens: int = Field(16, ge=2)
    # stop_token_ids: prompts whose reference greedy output gets one of its own tokens as a stop id
    n_stop: int = Field(4, ge=0)
    # Long contexts: n_long prompts of long_context_tokens (fewer where the model's context is shorter; skipped
    # below long_min_tokens), long_new_tokens greedy tokens each (ignore_eos), checked like the other splits.
    n_long: int = Field(2, ge=0)
    long_context_tokens: int = Field(1536, ge=8)
    long_new_tokens: int = Field(64, ge=2)
    long_min_tokens: int = Field(256, ge=8)
    # Late decode positions: one dev prompt generated and teacher-forced for this many tokens (0: off)
    late_tokens: int = Field(300, ge=0)


class SpeedConfig(_Frozen):
    """Dev speed workloads: natural length with EOS on and the fixed-length variant one request at a time, and the
    natural one batched (`batch_size` requests per call)."""

    enabled: bool = True
    n_prompts: int = Field(8, ge=1)
    reps: int = Field(3, ge=3)                  # medians of at least three interleaved repetitions
    warmup_requests: int = Field(1, ge=0)
    natural_max_new_tokens: int | None = Field(None, ge=1)  # None: the prepared workload's (256)
    fixed_max_new_tokens: int | None = Field(None, ge=1)
    run_on_fail: bool = False                   # a rejected candidate's speed is rarely worth the time
    # Serving throughput: besides the one-at-a-time workloads, `batch_size` fresh dev prompts (natural length) per
    # timed call, as a server with that many requests in flight sees them (capped at max_batch_size); 0: none
    batch_size: int = Field(32, ge=0)


class IsolationConfig(_Frozen):
    build_timeout_s: float = Field(600.0, gt=0)
    call_timeout_s: float = Field(600.0, gt=0)
    gate_timeout_s: float = Field(3600.0, gt=0)
    memory_limit_gb: float | None = Field(16.0, gt=0)  # CPU: RLIMIT_AS of each engine process
    # Each engine sandbox's host memory, its processes and RAM-backed /tmp and /dev/shm together, where the host lets
    # SEIS make a memory cgroup (CPU and GPU alike). None: engine_host.policy.engine_sandbox_memory_bytes()
    sandbox_memory_gb: float | None = Field(None, gt=0)
    max_tree_mb: float = Field(256.0, gt=0)      # refuse absurdly large candidate trees
    # CPU only: intra-op threads per engine process. One thread keeps CPU timings comparable on a shared
    # machine (a multi-threaded decode step stalls whenever another process holds a core). None: torch default.
    cpu_threads: int | None = Field(1, ge=1)


class GateConfig(_Frozen):
    candidate: Path
    model: str
    reference: Path = ENGINE_TEMPLATE
    parent: Path | None = None
    # With a snapshot store: the reference (vanilla) and parent come from these snapshots, never from live folders.
    store: Path | None = None
    reference_snapshot: str | None = None
    parent_snapshot: str | None = None
    retain_dir: Path | None = None              # on PASS the judged candidate copy is copied here (what to retain)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    prepared_dir: Path | None = None            # default: data/prepared
    max_prompt_tokens: int = Field(768, ge=8)   # prompts are left-truncated (the chat turn's end is kept)
    max_batch_size: int = Field(32, ge=1)
    seed: int = 0
    # Every GSM8K prompt of the gate, checked or timed, carries its own tag of this nonce (None: 64 random bits per
    # gate; see seis.workloads.gsm8k.request_tag): no engine can ship or precompute answers for the public
    # questions, rebuild one prompt from another, or tell a timed prompt from a checked one by its tag. Given, it
    # reproduces a gate's prompts (tests); recorded with the speed table.
    prompt_nonce: str | None = Field(None, pattern=r"^[0-9a-f]{4,32}$")
    use_cuda_graphs: bool = True
    checks: CheckSizes = CheckSizes()
    speed: SpeedConfig = SpeedConfig()
    isolation: IsolationConfig = IsolationConfig()
    thresholds: GateThresholds = GateThresholds()

    @model_validator(mode="after")
    def _check(self) -> "GateConfig":
        if (self.reference_snapshot or self.parent_snapshot) and self.store is None:
            raise ValueError("reference_snapshot / parent_snapshot need `store`")
        if self.checks.tf_max_tokens > self.checks.max_new_tokens:
            raise ValueError("checks.tf_max_tokens cannot exceed checks.max_new_tokens")
        return self

    @classmethod
    def preset(cls, size: GateSize, **values) -> "GateConfig":
        """The gate at one of its named sizes; explicit `values` win over the preset's.

        full: what a retained engine must pass. quick: a fast look (CPU sessions, the dev benchmark). smoke: the
        smallest sizes that still run every check (tests, CPU smoke runs)."""
        for key, value in _PRESETS[size]().items():
            values.setdefault(key, value)
        return cls(**values)


GateSize = Literal["smoke", "quick", "full"]


def _quick() -> dict:
    return dict(checks=CheckSizes(n_dev=4, n_heldout_gsm8k=4, n_heldout_shapes=2, max_new_tokens=24, tf_max_tokens=24,
                                  n_eos_probes=3, n_long=1, long_context_tokens=1024),
                speed=SpeedConfig(n_prompts=2, natural_max_new_tokens=32, fixed_max_new_tokens=32, batch_size=4),
                max_prompt_tokens=256)


def _smoke() -> dict:
    return dict(checks=CheckSizes(n_dev=2, n_heldout_gsm8k=2, n_heldout_shapes=1, max_new_tokens=12, tf_max_tokens=12,
                                  n_eos_probes=1, n_sampling_prompts=1, n_samples=32, n_stop=2, n_long=1,
                                  long_context_tokens=256, long_new_tokens=8, late_tokens=48),
                speed=SpeedConfig(n_prompts=1, natural_max_new_tokens=8, fixed_max_new_tokens=8, batch_size=2),
                max_prompt_tokens=128)  # CPU prefill dominates a small gate


_PRESETS = {"full": dict, "quick": _quick, "smoke": _smoke}
