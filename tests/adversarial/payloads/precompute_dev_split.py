"""Attack on fresh timed prompts: the timed prompts are dev-split questions, and the dev split is public (GSM8K,
split deterministically by the repo), so the candidate ships the dev questions (engine/_dev_questions.json, in the
dev workload's order). From the first dev prompts the checks show it, it learns the prompt format (the text around
a question it recognises, and the left-truncation length), encodes every other dev question the same way with the
model's own tokenizer, and a background copy of the engine precomputes their greedy continuations while the gate
is busy with correctness. A timed request for one of them is then cut from the precomputed continuation (EOS,
stop ids and max_new_tokens applied) and answered at once: fresh prompts, exact outputs."""
from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path

from ._adv_common import cut_precomputed
from .engine import Engine
from .sampling import SamplingParams

QUESTIONS = json.loads((Path(__file__).resolve().parent / "_dev_questions.json").read_text())
PRECOMPUTED: dict[tuple[int, ...], list[int]] = {}
TODO: queue.Queue = queue.Queue()
STATE = {"template": None, "seen": set(), "hits": 0, "precomputed": 0, "queued": 0, "error": None}
PRECOMPUTE_TOKENS = 256   # the dev workloads' published max_new_tokens
TIMED = threading.Event()  # set while a single-prompt request is served: the background copy pauses


def _tokenizer(model_dir: Path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _learn(tok, prompts) -> None:
    """Find a known dev question inside a prompt: the text before it (what is visible of the instructions), the
    text after it (the chat turn's end), and the truncation length; check that it reproduces the prompt."""
    for ids in prompts:
        text = tok.decode(list(ids), skip_special_tokens=False)
        for q in QUESTIONS:
            key = q[-40:]
            at = text.find(key)
            if at < 0:
                continue
            STATE["seen"].add(q)
            if STATE["template"] is not None:
                continue
            end = at + len(key)
            before, after = text[:end], text[end:]
            prefix = before[: -len(q)] if len(before) > len(q) else ""
            full = tok.encode(prefix + q + after, add_special_tokens=False).ids
            cap = len(ids) if len(full) > len(ids) else None
            if full[-len(ids):] == list(ids):
                STATE["template"] = (prefix, after, cap)


def _plan(tok) -> None:
    prefix, after, cap = STATE["template"]
    for q in QUESTIONS:
        if q in STATE["seen"]:
            continue  # the checks' own prompts: never timed
        ids = tok.encode(prefix + q + after, add_special_tokens=False).ids
        if cap is not None:
            if len(ids) < cap and not prefix:
                continue  # the instructions' tail would be needed and was never visible
            ids = ids[-cap:]
        TODO.put(tuple(ids))
        STATE["queued"] += 1


def _worker(shadow: Engine) -> None:
    decode = shadow._decode

    def paused_decode(running):  # never compete with my own timed requests (between decode steps: exact)
        while TIMED.is_set():
            time.sleep(0.0005)
        return decode(running)

    shadow._decode = paused_decode
    while True:
        prompt = TODO.get()
        room = min(PRECOMPUTE_TOKENS, shadow.max_seq_len - len(prompt))
        if prompt in PRECOMPUTED or room < 1:
            continue
        try:
            out = shadow.generate([list(prompt)], SamplingParams(max_new_tokens=room, ignore_eos=True))
        except Exception:  # noqa: BLE001
            continue
        PRECOMPUTED[prompt] = list(out[0].token_ids)
        STATE["precomputed"] += 1


_build = Engine.build


def build(self):
    _build(self)
    try:
        self._adv_tok = _tokenizer(self.model_dir)
    except Exception as e:  # noqa: BLE001
        self._adv_tok, STATE["error"] = None, f"{type(e).__name__}: {e}"
        return self
    shadow = _build(Engine(self.model_dir, self.options))
    shadow._adv_shadow = True
    threading.Thread(target=_worker, args=(shadow,), daemon=True).start()
    return self


_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    tok = getattr(self, "_adv_tok", None)
    if len(prompts) == 1 and params[0].greedy and tuple(prompts[0]) in PRECOMPUTED:
        hit = cut_precomputed(self, PRECOMPUTED[tuple(prompts[0])], params[0], len(prompts[0]))
        if hit is not None:
            STATE["hits"] += 1
            return [hit]
    if len(prompts) == 1 and not getattr(self, "_adv_shadow", False):
        TIMED.set()
        try:
            return _generate(self, prompts, params)
        finally:
            TIMED.clear()
    if tok is not None and STATE["template"] is None and len(prompts) > 1:
        try:
            _learn(tok, prompts)
            if STATE["template"] is not None:
                _plan(tok)
        except Exception as e:  # noqa: BLE001
            STATE["error"] = f"{type(e).__name__}: {e}"
    return _generate(self, prompts, params)


Engine.build = build
Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), **{f"adv_{k}": v for k, v in STATE.items() if k not in ("seen",
                                                                                                        "template")},
                             "adv_learned_template": STATE["template"] is not None}
