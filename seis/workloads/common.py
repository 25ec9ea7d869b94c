"""Small shared helpers: project paths, the error type, hashing, deterministic JSON and RNG."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PREPARED_DIR = PROJECT_ROOT / "data" / "prepared"


class WorkloadDataError(ValueError):
    """A source or prepared file is missing or malformed; the message names the path (and line)."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj: object) -> str:
    """One fixed serialisation (sorted keys, no spaces) so hashes don't depend on formatting."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def model_digest(model: BaseModel) -> str:
    return sha256_bytes(canonical_json(model.model_dump(mode="json")).encode("utf-8"))


def jsonl_bytes(models: Iterable[BaseModel]) -> bytes:
    lines = (json.dumps(m.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")) for m in models)
    return "".join(line + "\n" for line in lines).encode("utf-8")


def rng_for(*labels: object) -> random.Random:
    """A Random seeded from a hash of labels (e.g. seed, purpose, index): independent, reproducible streams.

    Callers use only `.random()`, whose sequence for a given integer seed Python guarantees across versions
    (choice/shuffle/randrange may change), via the helpers below.
    """
    digest = hashlib.sha256("/".join(map(str, labels)).encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def rand_below(rng: random.Random, n: int) -> int:
    return min(int(rng.random() * n), n - 1)


def shuffled(rng: random.Random, items: list) -> list:
    out = list(items)
    for i in range(len(out) - 1, 0, -1):  # Fisher-Yates on .random() only
        j = rand_below(rng, i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def read_prepared_jsonl(path: Path, model: type[M]) -> list[M]:
    """Validate every line of a prepared JSONL file; errors name the file and line."""
    if not path.is_file():
        raise WorkloadDataError(f"prepared file not found: {path}; run `python -m seis.workloads prepare`")
    out: list[M] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            out.append(model.model_validate_json(line))
        except ValueError as exc:
            raise WorkloadDataError(f"{path}:{lineno}: invalid {model.__name__}: {exc}") from exc
    return out
