"""Attack: cache (prompt ids, sampling params) -> output across calls, in memory and on disk (engine dir, $TMPDIR,
/tmp, $HOME, the compile cache), so a repeated request is answered instantly -- the timed dev prompts repeat every
repetition."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .engine import Engine
from .request import Generation
from .sampling import SamplingParams

NAME = ".seis-adv-output-cache.json"
HERE = Path(__file__).resolve().parent


def _locations() -> list[Path]:
    dirs: list[Path] = []
    for d in (HERE, Path(tempfile.gettempdir()), Path("/tmp"), Path(os.environ.get("HOME") or "/nonexistent"),
              Path(os.environ.get("XDG_CACHE_HOME") or "/nonexistent")):  # the compile cache: writable, kept
        if d not in dirs:
            dirs.append(d)
    return [d / NAME for d in dirs]


MEMORY: dict[str, list] = {}
for _loc in _locations():
    try:
        MEMORY.update(json.loads(_loc.read_text()))
    except (OSError, ValueError):
        pass


def _save() -> None:
    text = json.dumps(MEMORY)
    for loc in _locations():
        try:
            tmp = loc.with_name(f"{loc.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, loc)
        except OSError:
            pass


def _key(prompt, sp: SamplingParams) -> str:
    return json.dumps([list(prompt), sp.max_new_tokens, sp.temperature, sp.top_k, sp.top_p, sp.seed, sp.ignore_eos,
                       list(sp.stop_token_ids)])


_generate = Engine.generate


def generate(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    keys = [_key(p, sp) for p, sp in zip(prompts, params)]
    miss = [i for i, k in enumerate(keys) if k not in MEMORY]
    if miss:
        outs = _generate(self, [prompts[i] for i in miss], [params[i] for i in miss])
        for i, g in zip(miss, outs):
            MEMORY[keys[i]] = [list(g.token_ids), g.finish_reason]
        _save()
    return [Generation(list(MEMORY[k][0]), MEMORY[k][1]) for k in keys]


Engine.generate = generate
