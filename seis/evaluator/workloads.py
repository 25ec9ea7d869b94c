"""The prompts a gate runs, built from the prepared workloads (data/prepared) and the model's tokenizer.

Dev prompts are GSM8K dev questions (what agents may benchmark); held-out prompts are GSM8K test-split
questions plus the held-out token-id shapes, which only the evaluator ever runs. Everything is truncated to the
model's limits, so the same config on the same model always yields the same token ids (and the same digest).
"""
from __future__ import annotations

import hashlib
import json
import secrets
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..engine_host.client import Sampling
from ..workloads import (
    ensure_prepared,
    DevWorkload,
    WorkloadDataError,
    gsm8k_messages,
    load_dev_workloads,
    load_gsm8k_split,
    load_heldout_shapes,
    timed_question,
    verify_prepared,
)
from .errors import GateInputError
from .gate_config import GateConfig


@dataclass(frozen=True)
class PromptSet:
    """Requests in a fixed order: the batch composition the candidate and the reference both see."""

    name: str
    labels: tuple[str, ...]
    prompts: tuple[tuple[int, ...], ...]
    sampling: tuple[Sampling, ...]

    def __len__(self) -> int:
        return len(self.prompts)

    def prompt_lists(self) -> list[list[int]]:
        return [list(p) for p in self.prompts]

    def subset(self, indices: list[int], name: str | None = None) -> "PromptSet":
        return PromptSet(name or self.name, tuple(self.labels[i] for i in indices),
                         tuple(self.prompts[i] for i in indices), tuple(self.sampling[i] for i in indices))

    def __add__(self, other: "PromptSet") -> "PromptSet":
        return PromptSet(f"{self.name}+{other.name}", self.labels + other.labels, self.prompts + other.prompts,
                         self.sampling + other.sampling)


@dataclass(frozen=True)
class SpeedWorkload:
    """One dev speed workload: a warm-up set and one set of prompts per timed repetition. The sets are disjoint
    from each other, from every other speed workload and from the correctness checks' prompts, so no engine is
    ever timed on a prompt it has already seen (an output cache earns nothing)."""

    name: str
    workload_digest: str       # the prepared DevWorkload definition it came from
    warmup: PromptSet
    passes: tuple[PromptSet, ...]
    nonce: str = ""            # in every prompt of this gate's speed workloads
    batch: int = 1             # requests per timed call: 1 one at a time, else a whole pass as one batch

    @property
    def n_prompts(self) -> int:
        return len(self.passes[0]) if self.passes else 0

    @property
    def sampling(self) -> Sampling:
        return self.passes[0].sampling[0]


@dataclass(frozen=True)
class Budget:
    max_seq_len: int           # what the engines are built with
    check_prompt_cap: int
    speed_prompt_cap: int


EMPTY_LONG = PromptSet("long_context", (), (), ())
EMPTY_LATE = PromptSet("late", (), (), ())
EMPTY_CHAT_PROBES = PromptSet("eos_chat", (), (), ())

# EOS probes for models with a chat template (correctness._chat_probes): questions that a very short answer
# completes, so a real instruct model ends its turn within a few tokens. Held out like the GSM8K test split: the
# texts live here, in the evaluator, and reach no workspace; the gate's reports name them only as eos-chat:<i>.
CHAT_PROBE_QUESTIONS = (
    "Answer yes or no: is 2 larger than 1?",
    "Answer with a single number: how many legs does a cat have?",
    "Reply with one word: what is the opposite of hot?",
    "What is the chemical symbol for gold? Reply with the symbol only.",
    "Reply with one word: what is the plural of mouse?",
    "Answer with one word: what colour is grass?",
    "Answer yes or no: is ice cold?",
    "What is the first letter of the English alphabet? Answer with the letter only.",
    "Say only the word 'hello'.",
    "Reply with exactly one word: what animal says moo?",
    "Answer true or false: the sun is a star.",
    "Say only the word 'yes'.",
)
CHAT_PROBE_TOKENS = 24     # the reference's greedy answer to a chat probe must end within this (<= max_new_tokens)


@dataclass(frozen=True)
class GateWorkloads:
    dev: PromptSet
    heldout: PromptSet
    speed: tuple[SpeedWorkload, ...]
    budget: Budget
    manifest_digest: str
    long: PromptSet = EMPTY_LONG       # long-context prompts (empty: none fit, or n_long = 0; see long_note)
    late: PromptSet = EMPTY_LATE       # one dev prompt with a long greedy output (late decode positions)
    long_note: str = ""                # why long is empty, or how it was capped
    chat_probes: PromptSet = EMPTY_CHAT_PROBES  # chat-formatted EOS probe questions (empty: no chat template)
    chat_probe_note: str = ""          # why chat_probes is empty
    nonce: str = ""                    # the gate's prompt nonce (GateConfig.prompt_nonce): tags, sampling seeds

    def digest(self) -> str:
        extra = {"long": _set_json(self.long), "late": _set_json(self.late)} if len(self.long) or len(self.late) \
            else {}
        if len(self.chat_probes):
            extra["chat_probes"] = _set_json(self.chat_probes)
        return _digest({"manifest": self.manifest_digest, "dev": _set_json(self.dev),
                        "heldout": _set_json(self.heldout), "budget": asdict(self.budget),
                        "speed": [{"name": w.name, "workload": w.workload_digest,
                                   "passes": [_set_json(p) for p in (w.warmup, *w.passes)]}
                                  for w in self.speed], **extra})


def _set_json(s: PromptSet) -> dict:
    return {"labels": list(s.labels), "prompts": [list(p) for p in s.prompts],
            "sampling": [asdict(x) for x in s.sampling]}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_model_limits(model_dir: Path) -> tuple[int, int]:
    """(vocab_size, max_position_embeddings) from config.json."""
    from ..models.model_config import read_model_config
    c = read_model_config(model_dir)
    return c.vocab_size, c.max_position_embeddings


def _new_tokens(config: GateConfig, wl: DevWorkload) -> int:
    override = config.speed.fixed_max_new_tokens if wl.ignore_eos else config.speed.natural_max_new_tokens
    return override or wl.max_new_tokens


def make_budget(config: GateConfig, max_positions: int, speed_new: int | None) -> Budget:
    """speed_new: the longest speed output, or None when speed is not measured. The engines' context also fits
    the long-context prompts (long_context_tokens + long_new_tokens) and the late-positions request (a dev
    prompt + late_tokens), as far as the model allows (what does not fit is shortened in load_gate_workloads)."""
    sizes = config.checks
    check_new = sizes.max_new_tokens + sizes.probe_new_tokens
    new = max(check_new, speed_new or 0)
    long_need = sizes.long_context_tokens + sizes.long_new_tokens if sizes.n_long else 0
    late_need = config.max_prompt_tokens + sizes.late_tokens if sizes.late_tokens else 0
    max_seq_len = min(max_positions, max(config.max_prompt_tokens + new, long_need, late_need))
    budget = Budget(max_seq_len, min(config.max_prompt_tokens, max_seq_len - check_new),
                    min(config.max_prompt_tokens, max_seq_len - (speed_new or 0)))
    if min(budget.check_prompt_cap, budget.speed_prompt_cap) < 8:
        raise GateInputError(f"the model's context ({max_positions} positions) is too small for "
                             f"{new} new tokens plus a prompt; lower max_new_tokens")
    return budget


def _tokenizer(model_dir: Path):
    from ..prompts import load_tokenizer
    tok = load_tokenizer(model_dir)
    tok.model_max_length = sys.maxsize  # we truncate ourselves; silences the "longer than maximum" warning
    return tok


def _gsm8k_prompt(tok, question: str, cap: int) -> tuple[int, ...]:
    from ..prompts import encode_prompt
    ids = encode_prompt(tok, gsm8k_messages(question)[0]["content"], chat=bool(tok.chat_template))
    return tuple(ids[-cap:])  # keep the end: the chat turn's closing and the assistant header


def _shape_ids(ids: tuple[int, ...], allowed: list[int], vocab: int, special: set[int]) -> tuple[int, ...]:
    """Held-out ids drawn for a large vocabulary, mapped into this model's ordinary tokens."""
    return tuple(i if i < vocab and i not in special else allowed[i % len(allowed)] for i in ids)


def _spread(n_total: int, n: int) -> list[int]:
    if n <= 0 or n_total == 0:
        return []
    if n == 1 or n_total == 1:
        return [0]
    return sorted({round(i * (n_total - 1) / (n - 1)) for i in range(min(n, n_total))})


def _prepared(config: GateConfig, loader):
    try:
        ensure_prepared(config.prepared_dir)
        return loader()
    except WorkloadDataError as e:
        raise GateInputError(f"{e} (prepared workloads dir: {config.prepared_dir or 'data/prepared'})") from None


def _speed_workloads(config: GateConfig, tok, cap: int, nonce: str) -> tuple[SpeedWorkload, ...]:
    root, sp = config.prepared_dir, config.speed
    dev_items = _prepared(config, lambda: load_gsm8k_split("dev", root))
    by_id = {item.id: item for item in dev_items}
    checked = {item.id for item in dev_items[: config.checks.n_dev]}  # the correctness checks' dev prompts
    workloads = _prepared(config, lambda: load_dev_workloads(root))
    per_workload = sp.warmup_requests + sp.reps * sp.n_prompts
    batch = min(sp.batch_size, config.max_batch_size)
    batched = [w for w in workloads if not w.ignore_eos][:1] if batch else []  # the natural-length one
    per_batched = (1 + sp.reps) * batch  # a warm-up batch, then one batch per repetition
    pool = [i for i in workloads[0].item_ids if i not in checked] if workloads else []
    needed = per_workload * len(workloads) + per_batched * len(batched)
    if len(pool) < needed:
        raise GateInputError(f"the dev split has {len(pool)} prompts outside the correctness checks, but "
                             f"{len(workloads)} speed workloads x ({sp.warmup_requests} warm-up + {sp.reps} "
                             f"repetitions x {sp.n_prompts} prompts) and {len(batched)} batched workload x "
                             f"{1 + sp.reps} batches of {batch} need {needed} distinct ones; lower speed.n_prompts, "
                             f"speed.reps or speed.batch_size")
    out = []
    for k, wl in enumerate(workloads):
        new = _new_tokens(config, wl)
        sampling = Sampling(max_new_tokens=new, temperature=wl.temperature, ignore_eos=wl.ignore_eos)
        ids = pool[k * per_workload:(k + 1) * per_workload]

        def prompt_set(part: list[str], label: str) -> PromptSet:
            return PromptSet(f"{wl.name}/{label}", tuple(f"gsm8k-dev:{i}" for i in part),
                             tuple(_gsm8k_prompt(tok, timed_question(by_id[i], nonce), cap)
                                   for i in part),
                             (sampling,) * len(part))
        warm, timed = ids[: sp.warmup_requests], ids[sp.warmup_requests:]
        passes = tuple(prompt_set(timed[r * sp.n_prompts:(r + 1) * sp.n_prompts], f"rep{r}") for r in range(sp.reps))
        name = wl.name if new == wl.max_new_tokens else f"{wl.name}@{new}"  # sizes overridden (quick runs)
        out.append(SpeedWorkload(name, wl.digest(), prompt_set(warm, "warmup"), passes, nonce))
        if wl in batched:
            start = per_workload * len(workloads)
            ids = pool[start:start + per_batched]
            passes = tuple(prompt_set(ids[(r + 1) * batch:(r + 2) * batch], f"batch-rep{r}") for r in range(sp.reps))
            out.append(SpeedWorkload(f"{name}-batch{batch}", wl.digest(), prompt_set(ids[:batch], "batch-warmup"),
                                     passes, nonce, batch=batch))
    return tuple(out)


def _nonce(config: GateConfig) -> str:
    """The gate's prompt nonce: the config's (to reproduce a gate), else 64 random bits."""
    return config.prompt_nonce or secrets.token_hex(8)


def speed_new_tokens(config: GateConfig) -> int:
    wls = _prepared(config, lambda: load_dev_workloads(config.prepared_dir))
    return max(_new_tokens(config, w) for w in wls)


def load_speed_workloads(config: GateConfig, model_dir: Path) -> tuple[tuple[SpeedWorkload, ...], Budget, str]:
    """Only the dev speed workloads (for the agents' dev benchmark): no held-out file is opened."""
    manifest = _prepared(config, lambda: verify_prepared(config.prepared_dir))
    _, max_positions = read_model_limits(model_dir)
    budget = make_budget(config, max_positions, speed_new_tokens(config))
    return (_speed_workloads(config, _tokenizer(model_dir), budget.speed_prompt_cap, _nonce(config)), budget,
            manifest.digest())


def load_gate_workloads(config: GateConfig, model_dir: Path) -> GateWorkloads:
    root = config.prepared_dir
    manifest = _prepared(config, lambda: verify_prepared(root))
    vocab, max_positions = read_model_limits(model_dir)
    budget = make_budget(config, max_positions, speed_new_tokens(config) if config.speed.enabled else None)
    tok = _tokenizer(model_dir)
    cap, sizes = budget.check_prompt_cap, config.checks
    greedy = Sampling(max_new_tokens=sizes.max_new_tokens)
    # The checks' GSM8K prompts carry request tags as the timed ones do: a tag tells no engine whether it is timed
    nonce = _nonce(config)

    dev_items = _prepared(config, lambda: load_gsm8k_split("dev", root))[: sizes.n_dev]
    dev = PromptSet("dev", tuple(f"gsm8k-dev:{it.id}" for it in dev_items),
                    tuple(_gsm8k_prompt(tok, timed_question(it, nonce), cap) for it in dev_items),
                    (greedy,) * len(dev_items))

    test_items = _prepared(config, lambda: load_gsm8k_split("test", root))[: sizes.n_heldout_gsm8k]
    shapes = _prepared(config, lambda: load_heldout_shapes(root))
    chosen = [shapes.shapes[i] for i in _spread(len(shapes.shapes), sizes.n_heldout_shapes)]
    limit = min(vocab, len(tok))
    special = set(tok.all_special_ids)
    allowed = [i for i in range(limit) if i not in special]
    heldout = PromptSet(
        "heldout",
        tuple(f"gsm8k-test:{it.id}" for it in test_items) + tuple(f"shape:{s.prompt_len}x{s.output_len}"
                                                                  for s in chosen),
        tuple(_gsm8k_prompt(tok, timed_question(it, nonce), cap) for it in test_items)
        + tuple(_shape_ids(s.token_ids[:cap], allowed, limit, special) for s in chosen),
        (greedy,) * len(test_items)
        + tuple(Sampling(max_new_tokens=min(s.output_len, sizes.max_new_tokens), ignore_eos=shapes.ignore_eos)
                for s in chosen))
    long, long_note = _long_prompts(config, tok, budget.max_seq_len, shapes.shapes, allowed, limit, special)
    late = EMPTY_LATE
    if sizes.late_tokens and len(dev):
        late_new = min(sizes.late_tokens, budget.max_seq_len - len(dev.prompts[0]))
        if late_new >= 1:
            late = PromptSet("late", (f"{dev.labels[0]}@{late_new}",), dev.prompts[:1],
                             (Sampling(max_new_tokens=late_new, ignore_eos=True),))
    chat_probes, chat_note = chat_probe_prompts(config, tok, cap)
    speed = _speed_workloads(config, tok, budget.speed_prompt_cap, nonce) if config.speed.enabled else ()
    return GateWorkloads(dev, heldout, speed, budget, manifest.digest(), long, late, long_note, chat_probes, chat_note,
                         nonce)


def chat_probe_prompts(config: GateConfig, tok, cap: int) -> tuple[PromptSet, str]:
    """The chat probe questions through the model's own chat template (an assistant header last), each with a
    greedy EOS-on budget of min(CHAT_PROBE_TOKENS, max_new_tokens), which keeps question + answer + the probe's
    new tokens inside the engines' context. Empty, with the reason, where the tokenizer has no chat template (or
    its template fails on a plain user turn) or no question fits the prompt cap (a cut chat turn is no chat turn)."""
    sizes = config.checks
    if sizes.n_eos_probes == 0:
        return EMPTY_CHAT_PROBES, "n_eos_probes = 0"
    if not getattr(tok, "chat_template", None):
        return EMPTY_CHAT_PROBES, "the tokenizer has no chat template"
    from ..prompts import encode_prompt
    labels, prompts = [], []
    for i, question in enumerate(CHAT_PROBE_QUESTIONS):
        try:
            ids = tuple(encode_prompt(tok, question, chat=True))
        except Exception as e:  # noqa: BLE001 - a template that cannot render a user turn: no chat probes
            return EMPTY_CHAT_PROBES, f"the chat template failed on a user turn ({type(e).__name__})"
        if 0 < len(ids) <= cap:
            labels.append(f"eos-chat:{i}")
            prompts.append(ids)
    if not prompts:
        return EMPTY_CHAT_PROBES, f"no chat probe question fits the {cap}-token prompt cap"
    sampling = Sampling(max_new_tokens=min(CHAT_PROBE_TOKENS, sizes.max_new_tokens))
    return PromptSet("eos_chat", tuple(labels), tuple(prompts), (sampling,) * len(prompts)), ""


def _long_prompts(config: GateConfig, tok, max_seq_len: int, shapes, allowed: list[int], vocab: int,
                  special: set[int]) -> tuple[PromptSet, str]:
    """n_long prompts of long_context_tokens (or what fits): held-out shape ids (mapped into the vocabulary) followed
    by several GSM8K test-split questions (chat-encoded, uncapped, beyond the held-out ones), keeping the end, so
    every prompt closes with a whole question and an assistant header. Deterministic for a config and a model."""
    sizes = config.checks
    if sizes.n_long == 0:
        return EMPTY_LONG, "n_long = 0"
    length = min(sizes.long_context_tokens, max_seq_len - sizes.long_new_tokens)
    if length < sizes.long_min_tokens:
        return EMPTY_LONG, (f"only {length} prompt positions fit the model's context (max_seq_len {max_seq_len}), "
                            f"fewer than long_min_tokens {sizes.long_min_tokens}")
    test_items = _prepared(config, lambda: load_gsm8k_split("test", config.prepared_dir))
    heads = sorted(shapes, key=lambda s: -s.prompt_len)
    labels, prompts = [], []
    for i in range(sizes.n_long):
        tail: list[int] = []
        first = (sizes.n_heldout_gsm8k + 8 * i) % len(test_items)
        k = first
        while len(tail) < length // 2:
            tail += _gsm8k_prompt(tok, test_items[k % len(test_items)].question, length)
            k += 1
        head: list[int] = []
        j = i
        while heads and len(head) + len(tail) < length:
            head += _shape_ids(heads[j % len(heads)].token_ids, allowed, vocab, special)
            j += 1
        while len(head) + len(tail) < length:  # no shapes at all: more questions
            head = list(_gsm8k_prompt(tok, test_items[k % len(test_items)].question, length)) + head
            k += 1
        prompts.append(tuple((head + tail)[-length:]))
        labels.append(f"long:{length}:gsm8k-test[{first}:{k}]")
    note = f"{length} prompt tokens" + (f" (capped from {sizes.long_context_tokens} by the model's context)"
                                        if length < sizes.long_context_tokens else "")
    sampling = Sampling(max_new_tokens=sizes.long_new_tokens, ignore_eos=True)
    return PromptSet("long_context", tuple(labels), tuple(prompts), (sampling,) * len(prompts)), note
