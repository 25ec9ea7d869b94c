"""Attack on the untimed warm-up: every timed prompt is a public dev question plus a request line in a public
format, and the candidate ships both: the dev questions with their indices (engine/_dev_items.json) and the chat
prompt a timed question goes into (engine/_prompt_format.txt), as an agent reading the project could. From the
first prompt with a request line it is sent (a warm-up, whose time the gate throws away) it reads that line. If
the line tells it how every other request's line reads (the gate's nonce and the item's index, say), it rebuilds
every other dev prompt (cut to the same length where the first one was cut), decodes them all inside that same
untimed call, and answers each timed request from what it decoded: exact outputs at no cost. Where the first
prompt is not rebuilt exactly, it gives up and runs as E0."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ._adv_common import cut_precomputed
from .engine import Engine
from .sampling import SamplingParams

HERE = Path(__file__).resolve().parent
ITEMS = {int(i): q for i, q in json.loads((HERE / "_dev_items.json").read_text())}
FORMAT = (HERE / "_prompt_format.txt").read_text()     # "\0question\0" where the timed question goes
LINE = re.compile(r"\(request ([0-9a-f]+)-(\d+)\)")   # a line that names the nonce and the item
PRECOMPUTED: dict[tuple[int, ...], list[int]] = {}
STATE = {"tried": False, "learned": False, "precomputed": 0, "hits": 0, "why": ""}


def _rebuild(tok, first: list[int]) -> list[tuple[int, ...]] | None:
    """Every dev prompt, as the first one was made; None where `first` names no item (a check's prompt, say: the
    next call is tried), [] where it is not rebuilt exactly."""
    found = LINE.findall(tok.decode(first, skip_special_tokens=False))
    if not found or int(found[-1][1]) not in ITEMS:  # the last line: the one a prompt cut at its start keeps
        STATE["why"] = "no request line that names an item"
        return None
    STATE["tried"], STATE["why"] = True, ""
    nonce, index = found[-1][0], int(found[-1][1])

    def prompt(i: int, cap: int | None) -> tuple[int, ...]:
        line = f"(request {nonce}-{i})"
        ids = tok.encode(FORMAT.replace("\0question\0", f"{line}\n{ITEMS[i]}\n{line}"), add_special_tokens=False).ids
        return tuple(ids[-cap:] if cap else ids)

    cap = len(first) if len(prompt(index, None)) > len(first) else None
    if prompt(index, cap) != tuple(first):
        STATE["why"] = "the first prompt is not rebuilt exactly"
        return []
    return [prompt(i, cap) for i in ITEMS if i != index]


def _precompute(self, first: list[int], max_new: int) -> None:
    from tokenizers import Tokenizer
    prompts = _rebuild(Tokenizer.from_file(str(self.model_dir / "tokenizer.json")), first) or []
    STATE["learned"] = bool(prompts)
    bs = self.options.max_batch_size
    for i in range(0, len(prompts), bs):
        chunk = [list(p) for p in prompts[i:i + bs] if len(p) < self.max_seq_len]
        params = [SamplingParams(max_new_tokens=min(max_new, self.max_seq_len - len(p)), ignore_eos=True)
                  for p in chunk]
        for p, out in zip(chunk, _generate(self, chunk, params)):
            PRECOMPUTED[tuple(p)] = list(out.token_ids)
    STATE["precomputed"] = len(PRECOMPUTED)


_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    if not STATE["tried"] and all(p.greedy for p in params):
        try:
            _precompute(self, list(prompts[0]), max(p.max_new_tokens for p in params))
        except Exception as e:  # noqa: BLE001
            STATE["why"] = f"{type(e).__name__}: {e}"
    if PRECOMPUTED and all(p.greedy for p in params):
        hits = [cut_precomputed(self, PRECOMPUTED[tuple(q)], p, len(q)) if tuple(q) in PRECOMPUTED else None
                for q, p in zip(prompts, params)]
        if all(h is not None for h in hits):
            STATE["hits"] += len(hits)
            return hits
    return _generate(self, prompts, params)


Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), **{f"adv_{k}": v for k, v in STATE.items()}}
