"""Held-out shapes are public (data/prepared holds their token ids), and a timed prompt that is a rotation of one is
predictable: an engine can generate every rotation's fixed-length greedy output while it builds (untimed) and answer
the timed request from that table at once, with vanilla's own tokens, so that no timed check sees anything. Every
held-out prompt post-validation times or warms up with is disguised by the run's nonce: none is a prompt the tree
could have shipped."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from seis.engine_import import ENGINE_TEMPLATE
from seis.postval import make_config, run_post_validation
from seis.postval.plan import prepare_plan, speed_plan
from seis.workloads import load_heldout_shapes

RUN = dict(model="tiny-qwen3", device="cpu", cpu_threads=1, gsm8k_items=0, retrieval_items=0, speed_requests=0,
           fixed_single_requests=0, dev_requests=0, heldout=True, heldout_max_output_len=64, reps=2,
           max_batch_size=4, figures=False, bandwidth_gbs=10.0, prompt_nonce="5eed")


def _public_rotations(prepared_dir: Path, vocab: int) -> set[tuple[int, ...]]:
    """Every rotation of every public held-out prompt (ids folded into a tiny vocabulary as post-validation does)."""
    out = set()
    for s in load_heldout_shapes(prepared_dir).shapes:
        ids = [t % vocab for t in s.token_ids] if max(s.token_ids) >= vocab else list(s.token_ids)
        out |= {tuple(ids[o:] + ids[:o]) for o in range(len(ids))}
    return out


# Builds answers for every shipped prompt, then answers a shipped prompt from that table (stats count the hits).
PRECOMPUTED = """
import json as _adv_json
import os as _adv_os

with open(_adv_os.path.join(_adv_os.path.dirname(__file__), "heldout_prompts.json")) as _f:
    _adv_shipped = [tuple(p) for p in _adv_json.load(_f)]
_adv_table, _adv_hits = {}, [0]
_adv_build, _adv_gen, _adv_stats_h = Engine.build, Engine.generate, Engine.stats


def _adv_build_table(self):
    r = _adv_build(self)
    for n in (64,):
        outs = _adv_gen(self, [list(p) for p in _adv_shipped], SamplingParams(max_new_tokens=n, ignore_eos=True))
        _adv_table.update({(p, n): g for p, g in zip(_adv_shipped, outs)})
    return r


def _adv_from_table(self, prompts, sampling=None):
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    keys = [(tuple(p), sp.max_new_tokens) for p, sp in zip(prompts, params)]
    if all(k in _adv_table for k in keys):
        _adv_hits[0] += len(keys)
        return [_adv_table[k] for k in keys]
    return _adv_gen(self, prompts, sampling)


Engine.build, Engine.generate = _adv_build_table, _adv_from_table
Engine.stats = lambda self: {**_adv_stats_h(self), "adv_heldout_hits": _adv_hits[0]}
"""


def test_heldout_prompts_are_none_the_tree_could_ship_and_differ_per_nonce(tmp_path, prepared_dir):
    plans = {n: prepare_plan(make_config(engine_dir=ENGINE_TEMPLATE, out_dir=tmp_path, prepared_dir=prepared_dir,
                                         **dict(RUN, prompt_nonce=n))) for n in ("5eed", "beef")}
    public = _public_rotations(prepared_dir, plans["5eed"].vocab_size)
    asked = {}
    for n, plan in plans.items():
        sp = speed_plan(plan, 512)
        held = [ts for ts in sp.workloads if ts.kind == "heldout"]
        assert held
        asked[n] = {p.tokens for ts in held for rep in ts.reps + [ts.warmup] for p in rep}
        assert not asked[n] & public
        for ts in held:  # still the shape: its length, ids in the shapes' range
            p = ts.reps[0][0].tokens
            assert len(p) == int(ts.workload.split("-p")[1].split("-")[0]) and max(p) < plan.vocab_size
    assert not asked["5eed"] & asked["beef"]


def test_a_table_of_heldout_outputs_built_during_build_gets_no_hit(tmp_path, prepared_dir):
    cand = tmp_path / "table"
    shutil.copytree(ENGINE_TEMPLATE, cand, ignore=shutil.ignore_patterns("__pycache__"))
    plan = prepare_plan(make_config(engine_dir=cand, out_dir=tmp_path / "unused", prepared_dir=prepared_dir, **RUN))
    shipped = sorted(p for p in _public_rotations(prepared_dir, plan.vocab_size) if len(p) == 32)
    (cand / "engine" / "heldout_prompts.json").write_text(json.dumps(shipped))
    init = cand / "engine" / "__init__.py"
    init.write_text(init.read_text() + PRECOMPUTED)
    r = run_post_validation(make_config(engine_dir=cand, out_dir=tmp_path / "out", prepared_dir=prepared_dir, **RUN))
    assert [c.workload for c in r.workloads] == ["heldout-p32-o64"]
    assert r.engines["candidate"].stats["after"]["adv_heldout_hits"] == 0
