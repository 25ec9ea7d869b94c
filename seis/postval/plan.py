"""Everything checked and loaded before an engine starts: engine dirs, model, prepared data, prompts, memory."""
from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bandwidth import kv_bytes_per_token, nvml_handle, weight_bytes_per_token
from .config import PostValConfig, PostValError


@dataclass(frozen=True)
class Workload:
    """A named list of token-id prompts with one sampling setting."""
    name: str
    kind: str  # "test" | "dev" | "heldout"
    prompts: list[list[int]]
    max_new_tokens: int
    ignore_eos: bool


@dataclass
class Plan:
    config: PostValConfig
    model_dir: Path
    model_context: int  # the model's max_position_embeddings
    vocab_size: int
    tokenizer: Any
    gsm8k_items: list = field(default_factory=list)
    gsm8k_prompts: list[list[int]] = field(default_factory=list)
    gsm8k_max_new_tokens: int = 256
    retrieval_items: list = field(default_factory=list)
    retrieval_prompts: list[list[int]] = field(default_factory=list)
    retrieval_max_new_tokens: int = 32
    speed_prompts: list[list[int]] = field(default_factory=list)  # GSM8K test prompts, file order
    natural_max_new_tokens: int = 256
    fixed_new_tokens: int = 256
    dev: list[Workload] = field(default_factory=list)
    heldout: list[Workload] = field(default_factory=list)
    # Loaded sources, turned into prompts by _encode.
    speed_source: list = field(default_factory=list)
    dev_defs: list = field(default_factory=list)
    shapes: tuple = ()

    suite_context: int | None = None  # what the suite's longest request needs (set by _encode)
    memory_context: int | None = None  # the longest context both engines' KV caches fit in (set by _fit_memory)
    notes: list[str] = field(default_factory=list)  # said in the result

    @property
    def context(self) -> int:
        """Expected serving context; the built engines report the real one.

        Default: what the suite's longest request needs (a retrieval prompt), not the model's whole window:
        the KV cache is max_batch_size x context per engine, and Qwen3's 40,960 would not fit two engines on
        one GPU. E0 alone would cap it at 4096, too short for the long retrieval buckets."""
        want = self.config.max_seq_len or self.suite_context or self.model_context
        return min(want, self.model_context, self.memory_context or want)

    def engine_options(self) -> dict[str, Any]:
        return {**self.config.engine_options(), "max_seq_len": self.context}


def check_engine(label: str, path: Path) -> Path:
    from ..engine_import import check_engine_dir

    try:
        return check_engine_dir(path)
    except ValueError as exc:
        raise PostValError(f"{label}: {exc}") from None


def check_model(name: str) -> Path:
    """The model's HF directory (a registry model is prepared on first use)."""
    from ..models import ModelError, resolve_model

    try:
        return resolve_model(name)
    except ModelError as exc:
        raise PostValError(str(exc)) from None


def prepare_plan(config: PostValConfig) -> Plan:
    """Validate the inputs and build every prompt; raises PostValError before any engine work."""
    from ..prompts import load_tokenizer
    from ..workloads import WorkloadDataError, ensure_prepared

    check_engine("--engine", config.engine_dir)
    check_engine("vanilla engine", config.vanilla_dir)
    model_dir = check_model(config.model)
    model_cfg = json.loads((model_dir / "config.json").read_text())
    plan = Plan(config=config, model_dir=model_dir, model_context=int(model_cfg.get("max_position_embeddings", 4096)),
                vocab_size=int(model_cfg["vocab_size"]), tokenizer=None)
    try:
        ensure_prepared(plan.config.prepared_dir)
        _load_workloads(plan)
    except WorkloadDataError as exc:
        raise PostValError(f"prepared workloads: {exc}") from None
    plan.tokenizer = load_tokenizer(model_dir)
    _encode(plan)
    _fit_memory(plan)
    return plan


def _load_workloads(plan: Plan) -> None:
    from ..workloads import load_dev_workloads, load_gsm8k_split, load_heldout_shapes, load_manifest, load_retrieval
    from .accuracy import retrieval_subset

    c = plan.config
    manifest = load_manifest(c.prepared_dir)
    params = manifest.params
    plan.gsm8k_max_new_tokens = c.gsm8k_max_new_tokens or params.dev.max_new_tokens
    plan.natural_max_new_tokens = c.natural_max_new_tokens or params.dev.max_new_tokens
    plan.fixed_new_tokens = c.fixed_new_tokens or params.dev.fixed_new_tokens
    plan.retrieval_max_new_tokens = c.retrieval_max_new_tokens or params.retrieval.max_new_tokens
    test = load_gsm8k_split("test", c.prepared_dir) if c.gsm8k_items or c.speed_requests else []
    _check_size("gsm8k_items", c.gsm8k_items, len(test), "held-out GSM8K test items")
    _check_size("speed_requests", c.speed_requests, len(test), "held-out GSM8K test items")
    plan.gsm8k_items = test[: c.gsm8k_items]
    plan.speed_source = test  # trimmed to speed_requests after encoding (only prompts that fit count)
    if c.retrieval_items:
        items = load_retrieval(c.prepared_dir)
        _check_size("retrieval_items", c.retrieval_items, len(items), "retrieval items")
        plan.retrieval_items = retrieval_subset(items, c.retrieval_items)
    plan.dev_defs = []
    if c.dev_requests:
        dev = {it.id: it for it in load_gsm8k_split("dev", c.prepared_dir)}
        _check_size("dev_requests", c.dev_requests, len(dev), "GSM8K dev items")
        plan.dev_defs = [(wl, [dev[i] for i in wl.item_ids[: c.dev_requests]])
                          for wl in load_dev_workloads(c.prepared_dir)]
    plan.shapes = load_heldout_shapes(c.prepared_dir).shapes if c.heldout else ()


def _check_size(name: str, value: int, available: int, what: str) -> None:
    if value > available:
        raise PostValError(f"{name} (--{name.replace('_', '-')}) is {value}, but only {available} {what} exist")


def _encode(plan: Plan) -> None:
    from .accuracy import fits, gsm8k_prompts, retrieval_prompts

    c, tok = plan.config, plan.tokenizer
    plan.gsm8k_prompts = gsm8k_prompts(tok, plan.gsm8k_items)
    plan.retrieval_prompts = retrieval_prompts(tok, plan.retrieval_items)
    speed_candidates = gsm8k_prompts(tok, plan.speed_source[: c.speed_requests])
    dev_prompts = [(wl, gsm8k_prompts(tok, items)) for wl, items in plan.dev_defs]
    dev_new = max(plan.natural_max_new_tokens, plan.fixed_new_tokens)
    needs = [len(p) + plan.gsm8k_max_new_tokens for p in plan.gsm8k_prompts]
    needs += [len(p) + plan.retrieval_max_new_tokens for p in plan.retrieval_prompts]
    needs += [len(p) + dev_new for p in speed_candidates]
    needs += [len(p) + dev_new for _, prompts in dev_prompts for p in prompts]
    needs += [s.prompt_len + s.output_len for s in plan.shapes]
    plan.suite_context = -(-max(needs, default=1) // 1024) * 1024  # whole KiB-tokens
    # Speed: the first N test prompts that fit the engines' context (checked again after build).
    ctx = plan.context
    speed: list[list[int]] = []
    for i, item in enumerate(plan.speed_source):
        if len(speed) >= c.speed_requests:
            break
        p = speed_candidates[i] if i < len(speed_candidates) else gsm8k_prompts(tok, [item])[0]
        if fits(p, ctx):
            speed.append(p)
    plan.speed_prompts = speed
    for wl, prompts in dev_prompts:
        new = plan.fixed_new_tokens if wl.ignore_eos else plan.natural_max_new_tokens
        name = f"dev-fixed{new}" if wl.ignore_eos else "dev-natural"
        plan.dev.append(Workload(name, "dev", [p for p in prompts if fits(p, ctx)], new, wl.ignore_eos))
    for s in plan.shapes:
        if c.heldout_max_output_len and s.output_len > c.heldout_max_output_len:
            continue
        ids = list(s.token_ids)
        if max(ids) >= plan.vocab_size:  # tiny test vocabularies: fold the ids into range, keep the length
            ids = [t % plan.vocab_size for t in ids]
        plan.heldout.append(Workload(f"heldout-p{s.prompt_len}-o{s.output_len}", "heldout", [ids], s.output_len,
                                     True))


MIN_CONTEXT = 2048  # below this even the held-out shapes stop fitting


def _fit_memory(plan: Plan) -> None:
    """Both engines hold a KV cache of max_batch_size x context tokens for the whole run; it must fit.

    A default context is lowered to what fits (longer prompts are then skipped and counted, with a note);
    an explicit --max-seq-len that does not fit is an error that names the flags to lower.
    """
    c = plan.config
    on_cpu = _runs_on_cpu(c.device)
    dtype = c.dtype if c.dtype != "auto" else ("float32" if on_cpu else "bfloat16")
    try:
        per_tok = kv_bytes_per_token(plan.model_dir, dtype)
        weights = weight_bytes_per_token(plan.model_dir, dtype)
    except (KeyError, ValueError, OSError):
        return
    free = _mem_available() if on_cpu else _gpu_free(c.device)
    if not free:
        return
    where = "the CPU" if on_cpu else f"GPU {c.device}"
    # 80 % of what is free, less each engine's weights, as much again and 2 GiB for activations and graphs.
    budget = 0.8 * free - 2 * (2 * weights + 2**31)
    fitting = int(budget // (2 * per_tok * c.max_batch_size)) // 1024 * 1024
    if plan.context <= fitting:
        return
    if c.max_seq_len is None and fitting >= MIN_CONTEXT:
        plan.notes.append(
            f"context lowered from {plan.context} to {fitting} tokens so that both engines' KV caches "
            f"(max_batch_size {c.max_batch_size} x context each) fit the {free / 2**30:.0f} GiB free on {where}; "
            f"a lower --max-batch-size keeps the longest prompts")
        plan.memory_context = fitting
        return
    need = 2 * per_tok * c.max_batch_size * plan.context
    raise PostValError(
        f"the two engines' KV caches need {need / 2**30:.1f} GiB on {where} (max_batch_size "
        f"{c.max_batch_size} x context {plan.context} each) but only {free / 2**30:.1f} GiB is free; "
        f"lower --max-batch-size or --max-seq-len (or use --quick)")


def _gpu_free(device: str) -> int | None:
    """Free bytes on the GPU the engines will use, from NVML (the parent process never initialises CUDA)."""
    try:
        import pynvml  # nvidia-ml-py; optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(nvml_handle(pynvml, device)).free)
    except Exception:  # NVML trouble only skips the check; the engines then report real OOMs
        return None


def _runs_on_cpu(device: str) -> bool:
    if device == "cpu":
        return True
    if device != "auto":
        return False
    import torch  # lazy: only to learn where "auto" lands

    return not torch.cuda.is_available()


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fetch_snapshot(snapshot_id: str, store_root: Path, dest: Path) -> Path:
    """A retained engine from the snapshot store, materialised at dest (needs seis.store.SnapshotStore)."""
    store_cls = None
    if importlib.util.find_spec("seis.store") is not None:
        store_cls = getattr(importlib.import_module("seis.store"), "SnapshotStore", None)
    if store_cls is None:
        raise PostValError("--snapshot needs the snapshot store (seis.store.SnapshotStore), which is not part of "
                           "this checkout yet; snapshots arrive with the store. Pass --engine DIR instead.")
    if not Path(store_root).is_dir():  # checked here: opening a store creates its root
        raise PostValError(f"snapshot store not found at {store_root}; pass --store-root DIR")
    if Path(dest).exists() and any(Path(dest).iterdir()):
        raise PostValError(f"{dest} already exists and is not empty; choose another --out")
    try:
        store_cls(store_root).get(snapshot_id, dest)
    except (LookupError, RuntimeError, ValueError, OSError) as exc:  # unknown id, store or DVC trouble
        raise PostValError(f"snapshot {snapshot_id!r} from {store_root}: {exc}") from None
    return Path(dest)
