"""Long-context retrieval: one key/value fact (the needle) buried in seeded filler at several lengths/depths.

Everything comes from fixed word lists and seeded RNG streams, so the items are identical on every machine.
Lengths are approximate tokens (characters / chars_per_token); the evaluator measures real token counts
with the model's tokenizer.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from seis.workloads import _words as W
from seis.workloads.common import (
    DEFAULT_PREPARED_DIR,
    WorkloadDataError,
    rand_below,
    read_prepared_jsonl,
    rng_for,
    shuffled,
)
from seis.workloads.params import RetrievalParams

INSTRUCTION = "Read the document below, then answer the question after it."


class RetrievalItem(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str  # "retrieval-b<bucket>-<j>"
    index: int = Field(ge=0)
    bucket: int = Field(ge=0)  # length bucket, shortest first
    target_tokens: int  # the bucket's approximate context length in tokens
    depth: float = Field(ge=0.0, le=1.0)  # designed needle position as a fraction of the context
    needle_offset: int = Field(ge=0)  # character offset of the needle in context
    n_chars: int  # len(context)
    key: str  # e.g. "amber falcon"
    value: str  # six digits, the expected answer
    needle: str  # "The pass code for the amber falcon is 123456."
    question: str
    context: str


def bucket_lengths(params: RetrievalParams) -> list[int]:
    """Geometric steps from min_tokens to max_tokens, rounded to multiples of 32, strictly increasing."""
    n, lo, hi = params.n_buckets, params.min_tokens, params.max_tokens
    if n == 1:
        return [lo]
    lengths = [lo] + [round(lo * (hi / lo) ** (i / (n - 1)) / 32) * 32 for i in range(1, n - 1)] + [hi]
    if any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise WorkloadDataError(f"retrieval: {n} buckets between {lo} and {hi} tokens collide: {lengths}")
    return lengths


def _sentence(rng) -> str:
    def pick(words: tuple[str, ...]) -> str:
        return words[rand_below(rng, len(words))]

    def a(word: str) -> str:
        return ("an " if word[0] in "aeiou" else "a ") + word

    noun, adj, verb, prep = W.FILLER_NOUNS, W.FILLER_ADJECTIVES, W.FILLER_VERBS, W.FILLER_PREPOSITIONS
    form = rand_below(rng, 4)
    if form == 0:
        return f"The {pick(adj)} {pick(noun)} {pick(verb)} {pick(prep)} the {pick(noun)}."
    if form == 1:
        return f"{pick(W.FILLER_ADVERBS)}, the {pick(noun)} {pick(verb)} {pick(prep)} {a(pick(adj))} {pick(noun)}."
    if form == 2:
        return f"Every {pick(noun)} {pick(verb)} {pick(prep)} the {pick(adj)} {pick(noun)} {pick(W.FILLER_TIMES)}."
    first, second = a(pick(adj)), a(pick(adj))
    return f"{first.capitalize()} {pick(noun)} and {second} {pick(noun)} {pick(verb)} {pick(W.FILLER_TIMES)}."


def _keys_and_values(seed: int, n: int) -> list[tuple[str, str]]:
    """n distinct key phrases and n distinct six-digit values, so no two items share either."""
    pairs = [f"{a} {b}" for a in W.KEY_ADJECTIVES for b in W.KEY_NOUNS]
    if n > len(pairs):
        raise WorkloadDataError(f"retrieval: {n} items but only {len(pairs)} distinct keys")
    keys = shuffled(rng_for(seed, "retrieval", "keys"), pairs)[:n]
    rng, values, seen = rng_for(seed, "retrieval", "values"), [], set()
    while len(values) < n:
        v = str(100000 + rand_below(rng, 900000))
        if v not in seen:
            seen.add(v)
            values.append(v)
    return list(zip(keys, values))


def build_retrieval_items(params: RetrievalParams, seed: int) -> list[RetrievalItem]:
    """Buckets x items_per_bucket items; depths cycle within each bucket so each depth gets an equal share."""
    lengths = bucket_lengths(params)
    kv = _keys_and_values(seed, len(lengths) * params.items_per_bucket)
    items: list[RetrievalItem] = []
    for bucket, target_tokens in enumerate(lengths):
        for j in range(params.items_per_bucket):
            index = len(items)
            key, value = kv[index]
            depth = params.depths[j % len(params.depths)]
            needle = f"The pass code for the {key} is {value}."
            budget = int(target_tokens * params.chars_per_token) - len(needle) - 1
            rng = rng_for(seed, "retrieval", "filler", index)
            sentences: list[str] = []
            used = -1  # length of " ".join(sentences)
            while True:
                s = _sentence(rng)
                if used + 1 + len(s) > budget:
                    break
                sentences.append(s)
                used += 1 + len(s)
            # Needle at the sentence boundary nearest depth x filler length (in characters, not sentences).
            starts = [0]
            for sent in sentences:
                starts.append(starts[-1] + len(sent) + 1)
            at = min(range(len(starts)), key=lambda k: abs(starts[k] - depth * (used + 1)))
            before = " ".join(sentences[:at])
            context = " ".join(sentences[:at] + [needle] + sentences[at:])
            item = RetrievalItem(
                id=f"retrieval-b{bucket}-{j:02d}", index=index, bucket=bucket, target_tokens=target_tokens,
                depth=depth, needle_offset=len(before) + 1 if before else 0, n_chars=len(context), key=key,
                value=value, needle=needle,
                question=f"What is the pass code for the {key}? Answer with the six-digit number only.",
                context=context,
            )
            # The design promise: the fact and its parts appear once, so retrieval is unambiguous.
            if not context.count(needle) == context.count(key) == context.count(value) == 1:
                raise WorkloadDataError(f"retrieval {item.id}: needle, key or value is not unique in context")
            items.append(item)
    return items


def retrieval_messages(item: RetrievalItem) -> list[dict[str, str]]:
    """Chat messages for one item; the model's chat template turns them into a prompt later."""
    content = f"{INSTRUCTION}\n\n<document>\n{item.context}\n</document>\n\nQuestion: {item.question}"
    return [{"role": "user", "content": content}]


def score_retrieval(pred_text: str, item: RetrievalItem | str) -> bool:
    """Exact match: the expected six digits appear in the output as a whole number ("123,456" counts)."""
    value = item if isinstance(item, str) else item.value
    pattern = re.compile(rf"(?<!\d){re.escape(value)}(?!\d)")
    joined = re.sub(r"(?<=\d)[,\s](?=\d)", "", pred_text)  # "123,456" / "123 456" -> "123456"
    return bool(pattern.search(pred_text) or pattern.search(joined))


def load_retrieval(prepared_dir: str | Path | None = None) -> list[RetrievalItem]:
    return read_prepared_jsonl(Path(prepared_dir or DEFAULT_PREPARED_DIR) / "retrieval.jsonl", RetrievalItem)
