"""Everything checked and loaded before an engine starts: engine dirs, model, prepared data, prompts, memory."""
from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..host import available_ram_bytes, free_gpu_bytes, runs_on_cuda
from .bandwidth import kv_bytes_per_token, weight_bytes_per_token
from .postval_config import PostValConfig, PostValError


@dataclass(frozen=True)
class Workload:
    """A named list of token-id prompts with one sampling setting."""
    name: str
    kind: str  # "test" | "dev" | "heldout"
    prompts: list[list[int]]
    max_new_tokens: int
    ignore_eos: bool


@dataclass(frozen=True)
class Prompt:
    """One prompt and where it came from (a GSM8K item id; a held-out shape and rotation)."""
    id: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class TimedSet:
    """One mode of one speed workload: the prompts of each repetition (disjoint) and the warm-up prompts
    (never timed). Both engines time the same prompts in the same repetition."""
    workload: str
    kind: str  # "test" | "dev" | "heldout"
    mode: str  # "single" | "batch"
    max_new_tokens: int
    ignore_eos: bool
    requested: int  # requests per repetition asked for
    reps: list[list[Prompt]]
    warmup: list[Prompt]
    distinct: bool = True  # no timed prompt occurs twice in the process (nor among its warm-up prompts)

    @property
    def requests(self) -> int:
        return len(self.reps[0]) if self.reps else 0


@dataclass
class SpeedPlan:
    """Everything one pair of speed-phase engine processes times, in order (see speed_plan)."""
    speed: list[TimedSet]  # GSM8K test prompts: natural and fixed length, single and batch
    workloads: list[TimedSet]  # dev workloads and held-out shapes, single request
    pools: list  # result.PromptPool per source
    notes: list[str]

    @property
    def sets(self) -> list[TimedSet]:
        return self.speed + self.workloads


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
    test_pool: list[Prompt] = field(default_factory=list)  # every GSM8K test prompt (speed and warm-up)
    dev_pool: list[Prompt] = field(default_factory=list)  # the dev workloads' prompts, workload order
    natural_max_new_tokens: int = 256
    fixed_new_tokens: int = 256
    dev: list[Workload] = field(default_factory=list)
    heldout: list[Workload] = field(default_factory=list)
    # Loaded sources, turned into prompts by _encode.
    speed_source: list = field(default_factory=list)
    dev_defs: list = field(default_factory=list)
    shapes: tuple = ()
    heldout_range: tuple[int, int] = (0, 1)  # the held-out ids' range [low, high), in the model's vocabulary

    prompt_nonce: str = ""  # in every timed GSM8K prompt (the config's, or drawn by _encode)
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


def check_device(device: str) -> None:
    """A CUDA device asked for exists here: else both engines fail to build, which read as the engine's failure
    (exit 1) after the prompts were made, not as the bad input it is."""
    from ..host import missing_device
    why = missing_device(device)
    if why:
        raise PostValError(f"--device {device}: {why}; use --device auto or cpu")


def prepare_plan(config: PostValConfig) -> Plan:
    """Validate the inputs and build every prompt; raises PostValError before any engine work."""
    from ..prompts import load_tokenizer
    from ..workloads import WorkloadDataError, ensure_prepared

    check_engine("--engine", config.engine_dir)
    check_engine("vanilla engine", config.vanilla_dir)
    check_device(config.device)
    model_dir = check_model(config.model)
    from ..models.model_config import read_model_config
    model_cfg = read_model_config(model_dir, default_context=4096)
    plan = Plan(config=config, model_dir=model_dir, model_context=model_cfg.max_position_embeddings,
                vocab_size=model_cfg.vocab_size, tokenizer=None)
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
    timed = c.speed_requests or c.dev_requests or c.heldout  # warm-up prompts come from the test split too
    test = load_gsm8k_split("test", c.prepared_dir) if c.gsm8k_items or timed else []
    _check_size("gsm8k_items", c.gsm8k_items, len(test), "held-out GSM8K test items")
    _check_size("speed_requests", c.speed_requests, len(test), "held-out GSM8K test items")
    plan.gsm8k_items = test[: c.gsm8k_items]
    plan.speed_source = test if timed else []  # every repetition draws its own prompts (see speed_plan)
    if c.retrieval_items:
        items = load_retrieval(c.prepared_dir)
        _check_size("retrieval_items", c.retrieval_items, len(items), "retrieval items")
        plan.retrieval_items = retrieval_subset(items, c.retrieval_items)
    plan.dev_defs = []
    if c.dev_requests:
        dev = {it.id: it for it in load_gsm8k_split("dev", c.prepared_dir)}
        _check_size("dev_requests", c.dev_requests, len(dev), "GSM8K dev items")
        plan.dev_defs = [(wl, [dev[i] for i in wl.item_ids]) for wl in load_dev_workloads(c.prepared_dir)]
    if c.heldout:
        held = load_heldout_shapes(c.prepared_dir)
        plan.shapes = held.shapes
        # ids at or past the vocabulary are folded into it (_encode): the whole vocabulary is then the range
        plan.heldout_range = ((held.token_id_low, held.token_id_high) if held.token_id_high <= plan.vocab_size
                              else (0, plan.vocab_size))


def _check_size(name: str, value: int, available: int, what: str) -> None:
    if value > available:
        raise PostValError(f"{name} (--{name.replace('_', '-')}) is {value}, but only {available} {what} exist")


def _encode(plan: Plan) -> None:
    from .accuracy import fits, gsm8k_prompts, retrieval_prompts

    c, tok = plan.config, plan.tokenizer
    plan.gsm8k_prompts = gsm8k_prompts(tok, plan.gsm8k_items)
    plan.retrieval_prompts = retrieval_prompts(tok, plan.retrieval_items)
    # Timed prompts carry the run's nonce; the accuracy prompts are the questions as they are.
    plan.prompt_nonce = c.prompt_nonce or secrets.token_hex(8)
    speed_candidates = gsm8k_prompts(tok, plan.speed_source, plan.prompt_nonce)
    plan.test_pool = [Prompt(it.id, tuple(p)) for it, p in zip(plan.speed_source, speed_candidates, strict=True)]
    dev_prompts = [(wl, gsm8k_prompts(tok, items, plan.prompt_nonce)) for wl, items in plan.dev_defs]
    seen: set[str] = set()
    for (_, items), prompts in zip(plan.dev_defs, (p for _, p in dev_prompts), strict=True):
        for it, p in zip(items, prompts, strict=True):  # both dev workloads share their items: one pool
            if it.id not in seen:
                seen.add(it.id)
                plan.dev_pool.append(Prompt(it.id, tuple(p)))
    dev_new = max(plan.natural_max_new_tokens, plan.fixed_new_tokens)
    needs = [len(p) + plan.gsm8k_max_new_tokens for p in plan.gsm8k_prompts]
    needs += [len(p) + plan.retrieval_max_new_tokens for p in plan.retrieval_prompts]
    needs += [len(p) + dev_new for p in speed_candidates[: c.speed_requests]]  # the rest only if they fit
    needs += [len(p) + dev_new for _, prompts in dev_prompts for p in prompts[: c.dev_requests]]
    needs += [s.prompt_len + s.output_len for s in plan.shapes]
    plan.suite_context = -(-max(needs, default=1) // 1024) * 1024  # whole KiB-tokens
    ctx = plan.context  # the expected context; speed_plan draws from the pools with the built engines' one
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


WARMUP_PROMPTS = 8  # GSM8K test prompts reserved for warm-up (the split's last that fit), never timed


def speed_plan(plan: Plan, context: int) -> SpeedPlan:
    """What the speed phase times, for engines serving `context` tokens: no engine is timed on a prompt it has
    already seen in its process. The speed phase runs on fresh processes (after the accuracy phase's are
    closed), and within them every repetition of every workload and mode gets prompts of its own:

    - GSM8K test split: natural single, natural batch, fixed single, fixed batch, each repetition its own
      consecutive slice (natural single's first repetition: the split's first items, as before); the split's
      last prompts are the warm-up prompts of every GSM8K-shaped workload;
    - dev: both dev workloads draw from the dev items (dev-natural's first repetition is the gate's own set);
    - held-out shapes: repetition r times the shape's prompt rotated by r x step tokens, every id shifted within
      the shapes' range by the run's nonce (_disguised: same length, random ids, a prompt no tree could ship),
      warm-up one rotation further.

    Where a pool is too small, the requests per repetition shrink until everything fits (a note and the
    pool's `shrunk` say so); only when not even one prompt per repetition fits are prompts reused (`repeated`,
    and the row's `distinct_prompts` is False).
    """
    from .accuracy import fits
    from .result import PromptPool

    c, reps = plan.config, plan.config.reps
    notes: list[str] = []
    pools: list[PromptPool] = []
    test = _dedupe([p for p in plan.test_pool if fits(p.tokens, context)])
    n_warm = min(WARMUP_PROMPTS, max(len(test) - 1, 0)) if len(test) > 1 else 0
    warm = test[len(test) - n_warm:] if n_warm else test[:1]
    speed: list[TimedSet] = []
    if c.speed_requests and test:
        nat, fix = plan.natural_max_new_tokens, plan.fixed_new_tokens
        shapes = [(f"natural-{nat}", "single", nat, False, c.speed_requests),
                  (f"natural-{nat}", "batch", nat, False, c.speed_requests)]
        if c.fixed_single_requests:
            shapes.append((f"fixed-{fix}", "single", fix, True, c.fixed_single_requests))
        shapes.append((f"fixed-{fix}", "batch", fix, True, c.speed_requests))
        speed, pool = _draw("gsm8k-test", "test", test[: len(test) - n_warm], shapes, reps, warm, notes, n_warm)
        pools.append(pool.model_copy(update={"warmup": n_warm, "needed": pool.needed + n_warm,
                                             "available": len(test)}))
    workloads: list[TimedSet] = []
    if c.dev_requests and plan.dev:
        dev = _dedupe([p for p in plan.dev_pool if fits(p.tokens, context)])
        shapes = [(wl.name, "single", wl.max_new_tokens, wl.ignore_eos, c.dev_requests) for wl in plan.dev]
        if dev:
            sets, pool = _draw("gsm8k-dev", "dev", dev, shapes, reps, warm, notes)
            workloads += sets
            pools.append(pool)
        else:
            notes.append(f"dev workloads: no dev prompt fits the context ({context} tokens); skipped")
    for wl in plan.heldout:
        base = tuple(wl.prompts[0])
        if len(base) + wl.max_new_tokens > context or not fits(base, context):
            notes.append(f"{wl.name}: does not fit the context ({context} tokens); skipped")
            continue
        step = max(1, len(base) // (reps + 1))  # spread over the prompt: rotations share no long prefix
        offsets = dict.fromkeys(k * step % len(base) for k in range(reps + 1))
        rotations = _dedupe([Prompt(f"{wl.name}@rot{o}", _disguised(plan, wl.name, o, base[o:] + base[:o]))
                             for o in offsets])
        timed_rot, warm_rot = (rotations[:-1], rotations[-1:]) if len(rotations) > 1 else (rotations, rotations)
        sets, pool = _draw(wl.name, "heldout", timed_rot, [(wl.name, "single", wl.max_new_tokens, True, 1)], reps,
                           warm_rot, notes)
        workloads += sets
        pools.append(pool.model_copy(update={"warmup": 1, "needed": pool.needed + 1,
                                             "available": len(rotations)}))
    sp = SpeedPlan(speed=speed, workloads=workloads, pools=pools, notes=notes)
    _mark_repeats(sp)
    return sp


def _disguised(plan: Plan, name: str, offset: int, ids: tuple[int, ...]) -> tuple[int, ...]:
    """A held-out prompt shifted within the shapes' id range by an amount drawn from the run's nonce (per shape and
    rotation). The shapes are public (data/prepared) and so is every rotation of them: an engine could generate each
    one's fixed-length greedy output while it builds (untimed) and answer the timed request from that table, with
    vanilla's own tokens, so that no timed check saw anything. Shifted, a prompt is the same shape (length, random ids
    in the same range) and unknown until it is asked: a table would need one entry per shift and rotation."""
    from ..workloads.common import sha256_bytes

    lo, hi = plan.heldout_range
    if hi - lo < 2:
        return ids
    shift = 1 + int(sha256_bytes(f"{plan.prompt_nonce}:{name}:{offset}".encode())[:16], 16) % (hi - lo - 1)
    return tuple(lo + (t - lo + shift) % (hi - lo) if lo <= t < hi else t for t in ids)


def _dedupe(prompts: list[Prompt]) -> list[Prompt]:
    seen: set[tuple[int, ...]] = set()
    out = []
    for p in prompts:
        if p.tokens not in seen:
            seen.add(p.tokens)
            out.append(p)
    return out


def _draw(name: str, kind: str, pool: list[Prompt], shapes: list[tuple], reps: int, warm: list[Prompt],
          notes: list[str], reserved: int = 0) -> tuple[list[TimedSet], Any]:
    """Consecutive slices of `pool`, one per (shape, repetition), shape by shape; sizes capped until they fit."""
    from .result import PromptPool

    want = [s[4] for s in shapes]
    need = reps * sum(want)
    cap = max(want)
    while cap > 1 and reps * sum(min(w, cap) for w in want) > len(pool):
        cap -= 1
    sizes = [min(w, cap) for w in want]
    shrunk = sizes != want
    used = reps * sum(sizes)
    repeated = max(0, used - len(pool))
    if shrunk:
        besides = f" (besides {reserved} warm-up prompts)" if reserved else ""
        notes.append(f"{name}: {len(pool)} distinct prompts fit the context{besides}, but {reps} repetitions of "
                     + ", ".join(f"{s[0]}/{s[1]} ({w})" for s, w in zip(shapes, want, strict=True))
                     + f" need {need} that no repetition or workload of the same engine process has seen: requests "
                     f"per repetition lowered to " + ", ".join(map(str, sizes)))
    if repeated:
        notes.append(f"{name}: even one prompt per repetition needs {used} prompts, only {len(pool)} exist: "
                     f"{repeated} timed prompts repeat one the engine has already seen (its timings may be cached)")
    sets, i = [], 0
    for (workload, mode, max_new, ignore_eos, requested), n in zip(shapes, sizes, strict=True):
        rep_prompts = []
        for _ in range(reps):
            rep_prompts.append([pool[(i + k) % len(pool)] for k in range(n)])
            i += n
        sets.append(TimedSet(workload, kind, mode, max_new, ignore_eos, requested, rep_prompts, list(warm)))
    return sets, PromptPool(name=name, available=len(pool), needed=need, timed=used, warmup=0, shrunk=shrunk,
                            repeated=repeated)


def _mark_repeats(sp: SpeedPlan) -> None:
    """A set is distinct when none of its timed prompts occurs anywhere else in the process: in another
    repetition, workload or mode, or among any warm-up prompts."""
    from collections import Counter

    timed = Counter(p.tokens for ts in sp.sets for rep in ts.reps for p in rep)
    warm = {p.tokens for ts in sp.sets for p in ts.warmup}
    for i, ts in enumerate(sp.sets):
        distinct = all(timed[p.tokens] == 1 and p.tokens not in warm for rep in ts.reps for p in rep)
        if not distinct:
            fixed = dataclasses.replace(ts, distinct=False)
            if i < len(sp.speed):
                sp.speed[i] = fixed
            else:
                sp.workloads[i - len(sp.speed)] = fixed
            sp.notes.append(f"{ts.workload}/{ts.mode}: some timed prompts were already seen by the same engine "
                            f"process (another repetition, workload or warm-up): its timings may be cached")


MIN_CONTEXT = 2048  # below this even the held-out shapes stop fitting


def run_dtype(dtype: str, device: str) -> str:
    """The dtype both engines are asked to run at: "auto" is float32 on the CPU, bfloat16 on a GPU."""
    return dtype if dtype != "auto" else ("float32" if not runs_on_cuda(device) else "bfloat16")


def _fit_memory(plan: Plan) -> None:
    """Both engines hold a KV cache of max_batch_size x context tokens for the whole run; it must fit.

    A default context is lowered to what fits (longer prompts are then skipped and counted, with a note);
    an explicit --max-seq-len that does not fit is an error that names the flags to lower.
    """
    c = plan.config
    on_cpu = not runs_on_cuda(c.device)
    dtype = run_dtype(c.dtype, c.device)
    try:
        per_tok = kv_bytes_per_token(plan.model_dir, dtype)
        weights = weight_bytes_per_token(plan.model_dir, dtype)
    except (KeyError, ValueError, OSError):
        return
    free = available_ram_bytes() if on_cpu else free_gpu_bytes(c.device)
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


def fetch_snapshot(snapshot_id: str, store_root: Path, dest: Path) -> Path:
    """A retained engine from the snapshot store, materialised at dest."""
    from ..store import SnapshotStore
    if not Path(store_root).is_dir():  # checked here: opening a store creates its root
        raise PostValError(f"snapshot store not found at {store_root}; pass --store-root DIR")
    if Path(dest).exists() and any(Path(dest).iterdir()):
        raise PostValError(f"{dest} already exists and is not empty; choose another --out")
    try:
        SnapshotStore(store_root).get(snapshot_id, dest)
    except (LookupError, RuntimeError, ValueError, OSError) as exc:  # unknown id, store or DVC trouble
        raise PostValError(f"snapshot {snapshot_id!r} from {store_root}: {exc}") from None
    return Path(dest)
