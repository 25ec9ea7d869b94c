"""GSM8K and retrieval accuracy: prompts, subsets, scoring one engine's outputs, comparing two engines."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..workloads import (
    GSM8KItem,
    RetrievalItem,
    extract_answer,
    gsm8k_messages,
    is_correct,
    retrieval_messages,
    score_retrieval,
    timed_question,
)
from .result import AccuracySummary, BucketAccuracy, EngineName, ItemOutcome


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Chat-template a single user turn exactly as the rest of SEIS does (seis.prompts.encode_prompt)."""
    from ..prompts import encode_prompt

    if len(messages) != 1 or messages[0]["role"] != "user":
        raise ValueError("expected a single user message")
    return encode_prompt(tokenizer, messages[0]["content"], chat=True)


def gsm8k_prompts(tokenizer: Any, items: Sequence[GSM8KItem], nonce: str | None = None) -> list[list[int]]:
    """The items' chat prompts; with a nonce, as timed requests ask them (seis.workloads.timed_question)."""
    return [encode_messages(tokenizer, gsm8k_messages(timed_question(it, nonce) if nonce else
                                                      it.question)) for it in items]


def retrieval_prompts(tokenizer: Any, items: Sequence[RetrievalItem]) -> list[list[int]]:
    return [encode_messages(tokenizer, retrieval_messages(it)) for it in items]


def retrieval_subset(items: Sequence[RetrievalItem], n: int) -> list[RetrievalItem]:
    """n items covering every length bucket and, within buckets, every needle depth.

    Item i takes bucket i % B and, in round r = i // B, that bucket's item (r + bucket) % per_bucket, so a
    subset of 9 has one item per bucket at depths 0, .25, .5, .75, 1, 0, ... and n = all is a permutation.
    """
    by_bucket: dict[int, list[RetrievalItem]] = {}
    for it in items:
        by_bucket.setdefault(it.bucket, []).append(it)
    buckets = sorted(by_bucket)
    out: list[RetrievalItem] = []
    i = 0
    while len(out) < min(n, len(items)):
        b = buckets[i % len(buckets)]
        group = by_bucket[b]
        r = i // len(buckets)
        if r < len(group):
            out.append(group[(r + buckets.index(b)) % len(group)])
        i += 1
    return sorted(out, key=lambda it: it.index)


def fits(prompt: Sequence[int], context: int) -> bool:
    """The engine refuses prompts of `context` tokens or more; generation stops at the context."""
    return len(prompt) < context


def ids_sha(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Output:
    """What the engine returned for one prompt, decoded."""
    token_ids: list[int]
    finish_reason: str
    text: str


def score_gsm8k(engine: EngineName, items: Sequence[GSM8KItem], prompts: Sequence[Sequence[int]],
                outputs: Sequence[Output]) -> list[ItemOutcome]:
    return [
        ItemOutcome(task="gsm8k", id=it.id, engine=engine, prompt_tokens=len(p), output_tokens=len(o.token_ids),
                    finish_reason=o.finish_reason, output_sha=ids_sha(o.token_ids), text=o.text,
                    extracted=extract_answer(o.text), gold=it.answer, correct=is_correct(o.text, it.answer))
        for it, p, o in zip(items, prompts, outputs, strict=True)
    ]


def score_retrieval_items(engine: EngineName, items: Sequence[RetrievalItem], prompts: Sequence[Sequence[int]],
                          outputs: Sequence[Output]) -> list[ItemOutcome]:
    return [
        ItemOutcome(task="retrieval", id=it.id, engine=engine, prompt_tokens=len(p),
                    output_tokens=len(o.token_ids), finish_reason=o.finish_reason, output_sha=ids_sha(o.token_ids),
                    text=o.text, extracted=None, gold=it.value, correct=score_retrieval(o.text, it),
                    bucket=it.bucket, target_tokens=it.target_tokens)
        for it, p, o in zip(items, prompts, outputs, strict=True)
    ]


# An answer sits at the end of its output (GSM8K's is the number after the last "####", or the last number; a
# retrieval reply is a few tokens): every one of an output's last ANSWER_TAIL tokens must be vanilla's own pick.
ANSWER_TAIL = 16


def unbacked_answers(scorer: Any, prompts: Sequence[Sequence[int]], cand: Sequence[Output], van: Sequence[Output],
                     correct: Sequence[bool], margin: float, min_valid: float, max_new: int, context: int,
                     eos_ids: Sequence[int]) -> list[bool]:
    """Per item: whether the candidate's correct answer is one its model did not produce. The accuracy prompts are
    the public questions as they are, so a candidate can recognise them and answer from a table in its tree (or pull
    a retrieval value out of the prompt) while its model is wrong or never ran. Vanilla scores the candidate's own
    output teacher-forced (scorer: speed.VanillaScorer): an answer is backed when at least min_valid of its tokens,
    and every one of its last ANSWER_TAIL, are vanilla's top-1 within `margin` nats (the gate's near-tie rule: a bf16
    engine that rounds differently stays backed); a final EOS is left out (its noise is the stop margin's business).
    An output token-identical to vanilla's is vanilla's own and needs no scoring; wrong answers gain nothing."""
    ask = [i for i, (c, v, ok) in enumerate(zip(cand, van, correct, strict=True)) if ok and c.token_ids != v.token_ids]
    out = [False] * len(cand)
    judged = []
    for i in ask:
        ids = cand[i].token_ids
        if not ids or len(ids) > max_new or len(prompts[i]) + len(ids) > context:
            out[i] = True  # an answer in tokens beyond what the request allowed is not the model's
        else:
            judged.append(i)
    scores = scorer.score([list(prompts[i]) for i in judged], [cand[i].token_ids for i in judged], 1) if judged else []
    for i, sc in zip(judged, scores, strict=True):
        ok = [lp >= top[0] - margin for lp, top in zip(sc.token_logprobs, sc.top_logprobs, strict=True)]
        if cand[i].finish_reason == "stop" and cand[i].token_ids[-1] in eos_ids:
            ok = ok[:-1]
        out[i] = bool(ok) and (sum(ok) < min_valid * len(ok) - 1e-9 or not all(ok[-ANSWER_TAIL:]))
    return out


def charge_unbacked(outcomes: Sequence[ItemOutcome], unbacked: Sequence[bool]) -> list[ItemOutcome]:
    """The candidate's outcomes with each unbacked answer counted wrong (what it replied stays in text/extracted)."""
    return [o.model_copy(update={"backed": False, "correct": False}) if u else o
            for o, u in zip(outcomes, unbacked, strict=True)]


def _pct(correct: int, n: int) -> float | None:
    return 100.0 * correct / n if n else None


def flag_delta(delta_points: float | None, threshold: float = 3.0) -> bool:
    """Flag a difference strictly outside +-threshold points (exactly 3.0 is not flagged)."""
    return delta_points is not None and abs(delta_points) > threshold + 1e-9


def summarize_accuracy(task: str, outcomes: Sequence[ItemOutcome], skipped: int = 0,
                       threshold: float = 3.0) -> AccuracySummary:
    """Paired comparison over the items both engines answered."""
    cand = {o.id: o for o in outcomes if o.engine == "candidate"}
    van = {o.id: o for o in outcomes if o.engine == "vanilla"}
    if set(cand) != set(van):
        raise ValueError(f"{task}: the engines answered different items")
    ids = sorted(cand)
    c_ok = sum(cand[i].correct for i in ids)
    v_ok = sum(van[i].correct for i in ids)
    c_acc, v_acc = _pct(c_ok, len(ids)), _pct(v_ok, len(ids))
    delta = None if c_acc is None or v_acc is None else c_acc - v_acc
    return AccuracySummary(
        task=task, items=len(ids), skipped=skipped, candidate_acc=c_acc, vanilla_acc=v_acc, delta_points=delta,
        candidate_only=sum(cand[i].correct and not van[i].correct for i in ids),
        vanilla_only=sum(van[i].correct and not cand[i].correct for i in ids),
        identical_outputs=sum(cand[i].output_sha == van[i].output_sha for i in ids),
        flagged=flag_delta(delta, threshold), unbacked=sum(not cand[i].backed for i in ids))


def bucket_accuracy(items: Sequence[RetrievalItem], outcomes: Sequence[ItemOutcome]) -> list[BucketAccuracy]:
    """Retrieval accuracy per context-length bucket (skipped = selected items that did not fit)."""
    rows = []
    for b in sorted({it.bucket for it in items}):
        selected = [it for it in items if it.bucket == b]
        scored = [o for o in outcomes if o.bucket == b]
        c = [o.correct for o in scored if o.engine == "candidate"]
        v = [o.correct for o in scored if o.engine == "vanilla"]
        rows.append(BucketAccuracy(bucket=b, target_tokens=selected[0].target_tokens, items=len(c),
                                   skipped=len(selected) - len(c), candidate_acc=_pct(sum(c), len(c)),
                                   vanilla_acc=_pct(sum(v), len(v))))
    return rows


def decode_outputs(tokenizer: Any, raw: Sequence[dict]) -> list[Output]:
    """Engine replies ({token_ids, finish_reason}) -> decoded Outputs (special tokens such as EOS dropped)."""
    return [Output(list(r["token_ids"]), r["finish_reason"],
                   tokenizer.decode(r["token_ids"], skip_special_tokens=True)) for r in raw]
