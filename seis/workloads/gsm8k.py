"""GSM8K: read the shared source files, split test.jsonl deterministically, load prepared splits.

The source lives outside the project (`../shared/data/gsm8k`) and is never copied into git; only the
prepared splits under data/prepared/ (DVC output, git-ignored) are written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from seis.workloads.answers import extract_answer
from seis.workloads.common import (
    DEFAULT_PREPARED_DIR,
    PROJECT_ROOT,
    WorkloadDataError,
    read_prepared_jsonl,
    sha256_bytes,
)

GSM8K_ENV = "SEIS_GSM8K_DIR"
DEFAULT_GSM8K_DIR = PROJECT_ROOT.parent / "shared" / "data" / "gsm8k"
SOURCE_FILES = ("test.jsonl", "train.jsonl")
SplitName = Literal["test", "dev"]

INSTRUCTION = (
    "Solve the following math problem. Reason step by step, then give the final answer on the last line "
    'in the form "#### <answer>", where <answer> is just the number.'
)


class GSM8KItem(BaseModel):
    """One prepared problem: the question and the gold number only (the reference solution is not kept)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str  # "gsm8k-" + sha256(question)[:12]: stable whatever the file order
    index: int = Field(ge=0)  # 0-based line index in the source test.jsonl
    split: SplitName
    question: str
    answer: str  # normalised gold number, e.g. "18"


def gsm8k_messages(question: str) -> list[dict[str, str]]:
    """Chat messages for one problem; the model's chat template turns them into a prompt later.

    A single user turn (no system turn) so templates without a system role still accept it.
    """
    return [{"role": "user", "content": f"{INSTRUCTION}\n\nQuestion: {question}"}]


def timed_question(item: GSM8KItem, nonce: str) -> str:
    """A question as the gate asks it (checked and timed prompts alike) and post-validation times it. The questions
    are public; the nonce (drawn per gate or post-validation) is not, and no prompt shows it: each request's line
    is its own tag (request_tag), so one prompt an engine sees (an untimed warm-up, say) tells it nothing of any
    other, and no engine can ship or compute ahead the answers to the exact prompts. The first line comes before
    the question, so no question-specific prefix (its KV, say) can be computed ahead either: prompts share only
    the fixed instruction, as every GSM8K request does in real use. The second survives keep-the-end truncation."""
    line = f"(request {request_tag(nonce, item)})"
    return f"{line}\n{item.question}\n{line}"


def request_tag(nonce: str, item: GSM8KItem) -> str:
    """A request's tag: 64 bits of a one-way hash of the run's nonce and the item (its split and line). When every
    prompt carried the nonce itself, the first warm-up prompt let an engine rebuild every timed prompt of the gate
    and decode them all inside that untimed call. (A nonce given in a config is for reproducing a run, and only as
    secret as that config; drawn at random it is 64 bits.)"""
    return sha256_bytes(f"{nonce}:{item.split}:{item.index}".encode("utf-8"))[:16]


def item_id(question: str) -> str:
    return "gsm8k-" + sha256_bytes(question.encode("utf-8"))[:12]


def resolve_gsm8k_dir(gsm8k_dir: str | Path | None = None) -> Path:
    """Argument, else $SEIS_GSM8K_DIR, else ../shared/data/gsm8k from the project root; must hold the files."""
    if gsm8k_dir is not None:
        path, origin = Path(gsm8k_dir), "argument"
    elif os.environ.get(GSM8K_ENV):
        path, origin = Path(os.environ[GSM8K_ENV]), f"${GSM8K_ENV}"
    else:
        path, origin = DEFAULT_GSM8K_DIR, "default"
    if not path.is_dir():
        raise WorkloadDataError(
            f"GSM8K directory not found: {path} (from {origin}). It must hold {' and '.join(SOURCE_FILES)}; "
            f"pass --gsm8k-dir DIR or set {GSM8K_ENV}."
        )
    for name in SOURCE_FILES:
        if not (path / name).is_file():
            raise WorkloadDataError(f"GSM8K file missing: {path / name} (directory from {origin})")
    return path.resolve()


def read_gsm8k_file(path: Path) -> list[tuple[str, str]]:
    """(question, gold number) per line; any bad line raises with the path and 1-based line number."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadDataError(f"cannot read GSM8K file {path}: {exc}") from exc
    rows: list[tuple[str, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        where = f"{path}:{lineno}"
        if not line.strip():
            raise WorkloadDataError(f"{where}: empty line")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadDataError(f"{where}: not valid JSON: {exc}") from exc
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in ("question", "answer")):
            raise WorkloadDataError(f'{where}: expected an object with string "question" and "answer"')
        question, solution = obj["question"], obj["answer"]
        if "####" not in solution:
            raise WorkloadDataError(f'{where}: "answer" has no "#### <number>" line')
        gold = extract_answer(solution)
        if gold is None:
            raise WorkloadDataError(f'{where}: no number after "####" in "answer"')
        rows.append((question, gold))
    if not rows:
        raise WorkloadDataError(f"{path}: no items")
    return rows


def split_gsm8k(
    rows: list[tuple[str, str]], *, seed: int, test_size: int, dev_size: int, source: str = "test.jsonl"
) -> tuple[list[GSM8KItem], list[GSM8KItem]]:
    """Held-out test and dev splits, disjoint, each in original order.

    Items are ranked by sha256(seed:id), so the split depends only on the seed and the content, not on the
    Python version's RNG.
    """
    if test_size + dev_size > len(rows):
        raise WorkloadDataError(
            f"{source}: {len(rows)} items, fewer than test_size {test_size} + dev_size {dev_size}"
        )
    ids = [item_id(q) for q, _ in rows]
    if len(set(ids)) != len(ids):
        raise WorkloadDataError(f"{source}: duplicate questions, ids would not be unique")
    order = sorted(range(len(rows)), key=lambda i: sha256_bytes(f"{seed}:{ids[i]}".encode()))

    def build(indices: list[int], split: SplitName) -> list[GSM8KItem]:
        return [GSM8KItem(id=ids[i], index=i, split=split, question=rows[i][0], answer=rows[i][1])
                for i in sorted(indices)]

    return build(order[:test_size], "test"), build(order[test_size:test_size + dev_size], "dev")


def load_gsm8k_split(name: SplitName, prepared_dir: str | Path | None = None) -> list[GSM8KItem]:
    """Items of a prepared split (`python -m seis.workloads prepare` writes them)."""
    if name not in ("test", "dev"):
        raise ValueError(f"unknown GSM8K split {name!r}; expected 'test' or 'dev'")
    path = Path(prepared_dir or DEFAULT_PREPARED_DIR) / f"gsm8k_{name}.jsonl"
    return read_prepared_jsonl(path, GSM8KItem)

