"""Will a gate fit this machine? Every gate holds its engines at once (candidate, vanilla and, when speed is measured,
the parent), each with its weights and a KV cache of max_batch_size x max_seq_len tokens (E0's default). A run
whose gates cannot fit is refused before any work, with the numbers; one that fits only barely is let through."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..host import available_ram_bytes, free_gpu_bytes, runs_on_cuda
from ..run_config import RunConfig

GiB = 2**30
OVERHEAD_BYTES = GiB // 2       # per engine: interpreter, torch, activations, CUDA graphs / allocator slack
HEADROOM = 0.9                  # of what is free: the rest is left to the parent process and the agent


@dataclass(frozen=True)
class MemoryEstimate:
    where: str                  # "CPU RAM" or "GPU memory"
    engines: int
    weights_bytes: int          # per engine, at the engines' dtype
    kv_bytes: int               # per engine
    kv_tokens: int              # max_batch_size x max_seq_len
    kv_bytes_per_token: int
    overhead_bytes: int
    available_bytes: int | None
    dtype: str

    @property
    def per_engine(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    @property
    def needed(self) -> int:
        return self.engines * self.per_engine

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.needed <= HEADROOM * self.available_bytes

    def describe(self) -> str:
        avail = "unknown" if self.available_bytes is None else f"{self.available_bytes / GiB:.1f} GiB"
        return (f"a gate holds {self.engines} engines at once in {self.where}, each {self.per_engine / GiB:.2f} "
                f"GiB: weights {self.weights_bytes / GiB:.2f} GiB ({self.dtype}) + KV cache {self.kv_bytes / GiB:.2f} "
                f"GiB ({self.kv_tokens} tokens = max_batch_size x max_seq_len, {self.kv_bytes_per_token} bytes each) "
                f"+ {self.overhead_bytes / GiB:.2f} GiB overhead; {self.needed / GiB:.1f} GiB in all, "
                f"{avail} available (at most {HEADROOM:.0%} of it is used)")


class InsufficientMemory(ValueError):
    pass


def estimate_gate_memory(config: RunConfig, available_bytes: int | None = None,
                         on_cpu: bool | None = None) -> MemoryEstimate:
    """The memory one gate of this run needs. `available_bytes` / `on_cpu`: measured here unless given."""
    from ..evaluator.workloads import make_budget, speed_new_tokens
    from ..models import read_model_config, resolve_model
    from ..postval.bandwidth import dtype_bytes, safetensors_numels
    from .steps import gate_config

    gate = gate_config(config, candidate=Path("."))
    model_dir = resolve_model(config.model)
    model = read_model_config(model_dir)
    on_cpu = not runs_on_cuda(config.device) if on_cpu is None else on_cpu
    dtype = "float32" if on_cpu else "bfloat16"      # E0's "auto": float32 on a CPU, bfloat16 on CUDA
    width = dtype_bytes(dtype)
    try:
        speed_new = speed_new_tokens(gate) if gate.speed.enabled else None
    except Exception:  # workloads not prepared yet: the gate says so itself; size with the check lengths
        speed_new = None
    max_seq_len = make_budget(gate, model.max_position_embeddings, speed_new).max_seq_len
    kv_tokens = gate.max_batch_size * max_seq_len
    per_token = model.kv_bytes_per_token(width)
    weights = sum(safetensors_numels(model_dir).values()) * width
    engines = 3 if gate.speed.enabled else 2
    if available_bytes is None:
        available_bytes = available_ram_bytes() if on_cpu else free_gpu_bytes(config.device)
    return MemoryEstimate("CPU RAM" if on_cpu else "GPU memory", engines, weights, kv_tokens * per_token, kv_tokens,
                          per_token, OVERHEAD_BYTES, available_bytes, dtype)


def check_gate_memory(config: RunConfig, available_bytes: int | None = None,
                      on_cpu: bool | None = None) -> MemoryEstimate:
    """Refuse a run whose gates cannot fit (InsufficientMemory, naming the numbers)."""
    est = estimate_gate_memory(config, available_bytes, on_cpu)
    if not est.fits:
        short = math.ceil((est.needed / HEADROOM - est.available_bytes) / GiB)
        raise InsufficientMemory(
            f"the gates of this run cannot fit: {est.describe()}. Free about {short} GiB, or use a smaller model "
            f"or gate (gate=quick / smoke: shorter contexts).")
    return est


def preflight_run(config: RunConfig, resume: bool = False, resume_hint: str = "--resume {out}"
                  ) -> MemoryEstimate | None:
    """Every check before a run starts: the config's own (agent, model, output dir), then memory where the gates
    run: here, or with dispatch=workers on each worker before its session (None here). A refused run leaves no
    output dir behind."""
    existed = config.out.exists()
    config.preflight(resume=resume, resume_hint=resume_hint)
    if resume:
        _check_recorded_snapshots(config)
    if config.dispatch == "workers":
        return None
    try:
        return check_gate_memory(config)
    except Exception:
        if not existed and config.out.is_dir() and not any(config.out.iterdir()):
            config.out.rmdir()
        raise


def _check_recorded_snapshots(config: RunConfig) -> None:
    """A resume needs the engines the run recorded: one whose store lost them would redo (and first delete) the
    sessions that made them, against a new vanilla. With dispatch=workers only vanilla is the orchestrator's own;
    the sessions' engines come back from their worker.json refs."""
    from ..store import StoreError
    from .resume import missing_snapshots
    try:
        missing = missing_snapshots(config.out, config.store, outcomes_too=config.dispatch == "local")
    except StoreError as e:  # a store that refuses to open (a link among its files): a refusal like the others
        raise ValueError(str(e)) from None
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(f"the store {config.store} does not hold {len(missing)} snapshot(s) this run recorded "
                         f"({shown}): a resume would redo those sessions and delete their results. Put the store "
                         f"back at that path (move or mount it; in a clone: its <id>.json files from git, then "
                         f"dvc pull), or start a new run")
