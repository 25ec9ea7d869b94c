"""Post-validation: scoring, deltas and flags, statistics, the bound, E0 vs a copy of E0, determinism, files, CLI."""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from seis.engine_import import ENGINE_TEMPLATE
from seis.models.cache import cache_dir
from seis.postval import PostValError, PostValResult, make_config, plot_chain_speedups, run_post_validation
from seis.postval.accuracy import (
    Output,
    flag_delta,
    retrieval_subset,
    score_gsm8k,
    score_retrieval_items,
    summarize_accuracy,
)
from seis.postval.bandwidth import (
    bound_tok_per_s,
    kv_bytes_per_token,
    mean_decode_context,
    safetensors_numels,
    weight_bytes_per_token,
)
from seis.postval.result import ItemOutcome
from seis.postval.speed import Timing, alone, latency_stats, measure_pair, percentile, spread, timed_check
from seis.postval.tables import accuracy_markdown, speed_markdown, write_tables
from seis.workloads import (
    GSM8KItem,
    extract_answer,
    is_correct,
    load_retrieval,
    score_retrieval,
)

REPO = Path(__file__).resolve().parents[1]


# ---- fixtures ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def e0_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte copy of E0 in another directory: a 'retained engine' that must judge exactly like vanilla."""
    dest = tmp_path_factory.mktemp("candidate") / "engine_copy"
    shutil.copytree(ENGINE_TEMPLATE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


TINY = dict(model="tiny-qwen3", device="cpu", cpu_threads=1, gsm8k_items=6, retrieval_items=3, speed_requests=2,
            fixed_single_requests=1, dev_requests=1, reps=2, gsm8k_max_new_tokens=24, natural_max_new_tokens=16, fixed_new_tokens=16,
            heldout_max_output_len=64, max_batch_size=4, prompt_nonce="5eed")


# Hostile candidates: E0 with engine/__init__.py extended (the sandboxed worker imports the package).
ADV_CACHE_FILE = "seis-adv-output-cache.pkl"   # where OUTPUT_CACHE keeps its answers, in its compile cache
OUTPUT_CACHE = """
import os as _adv_os
import pickle as _adv_pickle

# kept in memory and in the compile cache (writable, and where a careless host would keep it for the next process)
_adv_file = _adv_os.path.join(_adv_os.environ.get("XDG_CACHE_HOME", "/nonexistent"), "seis-adv-output-cache.pkl")
try:
    with open(_adv_file, "rb") as _f:
        _adv_cache = _adv_pickle.load(_f)
except (OSError, ValueError, EOFError):
    _adv_cache = {}
_adv_loaded, _adv_hits = len(_adv_cache), {}
_adv_generate, _adv_stats = Engine.generate, Engine.stats


def _adv_cached(self, prompts, sampling=None):
    \"\"\"(prompt, sampling) -> output across calls: a repeated request is answered at once.\"\"\"
    params = self._per_request(sampling or SamplingParams(), len(prompts))
    keys = [(tuple(p), repr(sp)) for p, sp in zip(prompts, params)]
    miss = [i for i, k in enumerate(keys) if k not in _adv_cache]
    for k, sp in zip(keys, params):
        if k in _adv_cache:
            _adv_hits[sp.max_new_tokens] = _adv_hits.get(sp.max_new_tokens, 0) + 1
    if miss:
        for i, g in zip(miss, _adv_generate(self, [prompts[i] for i in miss], [params[i] for i in miss])):
            _adv_cache[keys[i]] = g
        try:
            with open(_adv_file, "wb") as f:
                _adv_pickle.dump(_adv_cache, f)
        except OSError:
            pass
    return [_adv_cache[k] for k in keys]


Engine.generate = _adv_cached
Engine.stats = lambda self: {**_adv_stats(self), **{f"adv_cache_hits_{k}": v for k, v in _adv_hits.items()},
                             "adv_cache_loaded": _adv_loaded}
"""

BATCH_OF_ONE = """
_adv_generate = Engine.generate


def _adv_fast_single(self, prompts, sampling=None):
    \"\"\"A single-prompt generate (how requests are timed) runs every other decoder layer; batches run them all.\"\"\"
    layers = self.model.layers
    if len(prompts) == 1:
        self.model.layers = layers[::2]
    try:
        return _adv_generate(self, prompts, sampling)
    finally:
        self.model.layers = layers


Engine.generate = _adv_fast_single
"""


def hostile(dest: Path, code: str) -> Path:
    shutil.copytree(ENGINE_TEMPLATE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    init = dest / "engine" / "__init__.py"
    init.write_text(init.read_text() + code)
    return dest


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory, prepared_dir, e0_copy) -> tuple[PostValResult, PostValResult]:
    """Two full runs of a copy of E0 against E0 on tiny-qwen3 (the first measures bandwidth, the second
    takes a configured one)."""
    out1, out2 = tmp_path_factory.mktemp("run1"), tmp_path_factory.mktemp("run2")
    r1 = run_post_validation(make_config(engine_dir=e0_copy, out_dir=out1, prepared_dir=prepared_dir, **TINY))
    r2 = run_post_validation(make_config(engine_dir=e0_copy, out_dir=out2, prepared_dir=prepared_dir,
                                         bandwidth_gbs=10.0, **TINY))
    return r1, r2


# ---- scoring, deltas, flags ----------------------------------------------------------------------------------

def _gsm(i: int, answer: str) -> GSM8KItem:
    return GSM8KItem(id=f"gsm8k-{i:012d}", index=i, split="test", question=f"q{i}", answer=answer)


def test_gsm8k_scoring_uses_the_workload_extraction():
    items = [_gsm(0, "18"), _gsm(1, "1000"), _gsm(2, "5"), _gsm(3, "7")]
    texts = ["She sells 9 eggs, 9 * 2 = 18.\n#### 18", "The total is $1,000.", "#### 6", "no number at all"]
    outs = [Output([1, 2, 3], "stop", t) for t in texts]
    scored = score_gsm8k("candidate", items, [[1]] * 4, outs)
    assert [o.extracted for o in scored] == [extract_answer(t) for t in texts] == ["18", "1000", "6", None]
    assert [o.correct for o in scored] == [is_correct(t, it.answer) for t, it in zip(texts, items, strict=True)]
    assert [o.correct for o in scored] == [True, True, False, False]
    assert all(o.task == "gsm8k" and o.output_tokens == 3 for o in scored)


def test_retrieval_scoring_and_subset_covers_buckets_and_depths(prepared_dir):
    items = load_retrieval(prepared_dir)
    sub = retrieval_subset(items, 9)
    assert len({it.bucket for it in sub}) == 9 and len({it.depth for it in sub}) == 5
    assert sorted(it.id for it in retrieval_subset(items, len(items))) == sorted(it.id for it in items)
    it = sub[0]
    outs = [Output([5], "stop", f"The pass code is {it.value[:3]},{it.value[3:]}."), Output([5], "stop", "123")]
    scored = score_retrieval_items("vanilla", [it, it], [[1], [1]], outs)
    assert [o.correct for o in scored] == [score_retrieval(o.text, it) for o in outs] == [True, False]
    assert scored[0].bucket == it.bucket and scored[0].target_tokens == it.target_tokens


def _outcomes(n: int, cand_right: int, van_right: int) -> list[ItemOutcome]:
    def one(engine, i, ok):
        return ItemOutcome(task="gsm8k", id=f"i{i:03d}", engine=engine, prompt_tokens=1, output_tokens=1,
                           finish_reason="stop", output_sha="x" if ok else "y", text="", extracted=None, gold="1",
                           correct=ok)
    return ([one("candidate", i, i < cand_right) for i in range(n)] +
            [one("vanilla", i, i < van_right) for i in range(n)])


@pytest.mark.parametrize("cand, van, delta, flagged", [
    (50, 50, 0.0, False), (53, 50, 3.0, False), (47, 50, -3.0, False), (54, 50, 4.0, True), (46, 50, -4.0, True),
])
def test_accuracy_delta_in_points_and_three_point_flag(cand, van, delta, flagged):
    s = summarize_accuracy("gsm8k", _outcomes(100, cand, van), skipped=2)
    assert s.candidate_acc == cand and s.vanilla_acc == van and s.items == 100 and s.skipped == 2
    assert s.delta_points == pytest.approx(delta) and s.flagged is flagged
    assert s.candidate_only == max(cand - van, 0) and s.vanilla_only == max(van - cand, 0)
    assert s.identical_outputs == 100 - abs(cand - van)


def test_flag_threshold_is_strict_and_configurable():
    assert not flag_delta(None) and not flag_delta(3.0) and flag_delta(3.01) and flag_delta(-3.5)
    assert not flag_delta(4.0, threshold=5.0)


def test_no_items_gives_no_accuracy_and_no_flag():
    s = summarize_accuracy("retrieval", [], skipped=9)
    assert s.items == 0 and s.delta_points is None and not s.flagged and s.skipped == 9


# ---- statistics and the bound --------------------------------------------------------------------------------

def test_latency_percentiles_on_known_numbers():
    values = [float(v) for v in range(1, 11)]  # 1..10
    s = latency_stats(values)
    assert (s.n, s.mean, s.median) == (10, 5.5, 5.5)
    assert (s.p10, s.p25, s.p75, s.p90) == pytest.approx((1.9, 3.25, 7.75, 9.1))
    assert percentile([4.0], 90) == 4.0 and percentile([0.0, 10.0], 50) == 5.0
    sp = spread([3.0, 1.0, 2.0])
    assert (sp.median, sp.min, sp.max) == (2.0, 1.0, 3.0)


def test_weight_and_kv_bytes_follow_the_safetensors_and_config():
    from seis.models import resolve_model

    for name in ("tiny-qwen3", "tiny-llama"):
        d = resolve_model(name)
        cfg = json.loads((d / "config.json").read_text())
        numels = safetensors_numels(d)
        total = sum(numels.values())
        embed = next(n for k, n in numels.items() if k.endswith("embed_tokens.weight"))
        expected = total if cfg["tie_word_embeddings"] else total - embed  # untied input table: one row read
        assert weight_bytes_per_token(d, "float32") == 4 * expected
        assert weight_bytes_per_token(d, "bfloat16") == 2 * expected
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        assert kv_bytes_per_token(d, "float32") == 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * hd * 4


def test_mean_context_and_bound():
    # One request, prompt 10, 4 new tokens: decode contexts 10, 11, 12, 13 -> mean 11.5.
    assert mean_decode_context([10], [4]) == 11.5
    assert mean_decode_context([10, 100], [2, 0]) == 10.5
    assert bound_tok_per_s(1000.0, 80, 2, 10.0) == 10.0


# ---- full runs on tiny-qwen3 ---------------------------------------------------------------------------------

def test_e0_copy_against_vanilla_has_zero_delta_and_speedup_near_one(tiny_runs):
    r, _ = tiny_runs
    gsm = r.accuracy_of("gsm8k")
    assert gsm.items + gsm.skipped == TINY["gsm8k_items"] and gsm.items > 0
    assert gsm.delta_points == 0.0 and not gsm.flagged and gsm.identical_outputs == gsm.items
    assert not r.flags and not r.accuracy_flagged
    # tiny-qwen3's context (512) is shorter than every retrieval prompt: all skipped, and said so.
    ret = r.accuracy_of("retrieval")
    assert ret.items == 0 and ret.skipped == TINY["retrieval_items"]
    assert any("retrieval" in n and "skipped" in n for n in r.notes)
    # every figure names what it was measured on: the device by name, the weights, the commit
    from seis.postval.tables import speed_markdown
    from seis.provenance import source_commit
    assert (r.device_name, r.weights, r.commit) == ("cpu", "random weights", source_commit())
    assert f"Measured on cpu, model {r.config.model} (random weights), commit {r.commit}." in speed_markdown(r)
    assert [(c.workload, c.mode) for c in r.speed] == [
        ("natural-16", "single"), ("natural-16", "batch"), ("fixed-16", "single"), ("fixed-16", "batch")]
    assert [c.workload for c in r.workloads] == ["dev-natural", "dev-fixed16", "heldout-p32-o64"]
    for c in r.speed + r.workloads:
        assert c.requests >= 1 and len(c.speedup.values) == TINY["reps"]
        assert 0.2 < c.speedup.median < 5  # same engine twice: timing noise only, never asserted tightly
        assert c.candidate.tokens == c.vanilla.tokens  # same greedy outputs, same token counts
        # Every timed output checked against vanilla's for the same request: a copy of E0 matches exactly.
        t = c.timed
        assert t.requests == c.requests * TINY["reps"] and t.identical_frac == 1.0 and t.length_ratio == 1.0
        assert not t.flagged and not t.reasons and t.missing == t.over_length == 0 and c.distinct_prompts
        if c.mode == "single":
            lat = c.vanilla.latency
            assert lat.p10 <= lat.p25 <= lat.median <= lat.p75 <= lat.p90
            assert c.vanilla.bound_tok_per_s > 0 and c.vanilla.mean_context > 0
            assert len(c.vanilla.request_latency_s) == c.requests * TINY["reps"]
        else:
            assert c.vanilla.latency is None and c.vanilla.bound_tok_per_s is None
    fixed = {c.mode: c for c in r.speed if c.workload == "fixed-16"}
    assert fixed["single"].ignore_eos and fixed["single"].vanilla.output_lengths.min == 16
    # Fixed-length single requests time only the first N prompts; the batch timing takes them all.
    assert (fixed["single"].requests, fixed["batch"].requests) == (TINY["fixed_single_requests"], TINY["speed_requests"])
    assert r.bandwidth.source.startswith("measured") and r.bandwidth.bytes_per_s > 0
    assert not r.energy_available and "unavailable" in r.energy_note
    assert r.context_tokens == r.vanilla_context_tokens == 512 and r.device == "cpu"
    assert not r.timed_flagged and not r.context_flagged and not r.flags
    # The speed phase ran on fresh processes: both phases' builds are measured, the extra one is noted.
    for info in r.engines.values():
        assert set(info.build_s) == {"accuracy", "speed"} and all(v > 0 for v in info.build_s.values())
    assert any(n.startswith("speed phase: fresh engine processes") for n in r.notes)
    assert any("sandbox was frozen" in n for n in r.notes)
    assert "vanilla E0's attention backend: torch" in r.notes  # on CPU E0 runs the torch path


def test_every_repetition_times_prompts_its_process_has_not_seen(tiny_runs, prepared_dir):
    r, _ = tiny_runs
    timed = [pid for c in r.speed + r.workloads for rep in c.prompt_ids for pid in rep]
    assert len(timed) == len(set(timed))  # across repetitions, modes and workloads of the speed processes
    for c in r.speed + r.workloads:
        assert len(c.prompt_ids) == TINY["reps"] and all(len(rep) == c.requests for rep in c.prompt_ids)
        assert c.requests == c.requested
    natural = next(c for c in r.speed if (c.workload, c.mode) == ("natural-16", "single"))
    from seis.postval import prepare_plan
    from seis.postval.accuracy import fits
    pool = prepare_plan(make_config(engine_dir=ENGINE_TEMPLATE, prepared_dir=prepared_dir, **TINY)).test_pool
    first = [p.id for p in pool if fits(p.tokens, r.context_tokens)][: TINY["speed_requests"]]
    assert natural.prompt_ids[0] == first  # the first repetition: the split's first items that fit, as before
    held = next(c for c in r.workloads if c.kind == "heldout")
    assert [rep[0].split("@")[1] for rep in held.prompt_ids] == ["rot0", "rot10"]  # 32-token prompt, 2 reps
    assert all(p.repeated == 0 and not p.shrunk for p in r.prompt_pools)
    assert {p.name for p in r.prompt_pools} == {"gsm8k-test", "gsm8k-dev", "heldout-p32-o64"}


def test_two_runs_give_the_same_outputs(tiny_runs):
    r1, r2 = tiny_runs
    key = lambda r: [(i.task, i.id, i.engine, i.output_sha, i.text, i.correct) for i in r.items]  # noqa: E731
    assert key(r1) == key(r2) and r1.items
    for a, b in zip(r1.speed + r1.workloads, r2.speed + r2.workloads, strict=True):
        assert (a.workload, a.mode, a.vanilla.tokens, a.candidate.tokens) == (b.workload, b.mode, b.vanilla.tokens,
                                                                              b.candidate.tokens)
    assert r2.bandwidth.source == "configured" and r2.bandwidth.bytes_per_s == 10e9


def test_tables_figures_and_json_are_written(tiny_runs):
    import pandas as pd

    r, _ = tiny_runs
    out = Path(r.config.out_dir)
    for name in ("accuracy", "speed", "latency", "workload"):
        md = (out / f"{name}.md").read_text()
        assert md.startswith("# ") and "| " in md and "Accuracy vs vanilla within ±3 points" in md
        df = pd.read_parquet(out / f"{name}.parquet")
        assert len(df) > 0
        assert ("flagged" if name == "accuracy" else "accuracy_flag") in df.columns
    for name in ("throughput", "latency", "accuracy", "workload"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    items = pd.read_parquet(out / "items.parquet")
    assert len(items) == len(r.items) and set(items["engine"]) == {"candidate", "vanilla"}
    back = PostValResult.model_validate_json((out / "postval.json").read_text())
    assert back.accuracy == r.accuracy and back.speed == r.speed and set(back.files) >= {"speed.md", "postval.json"}
    speed = pd.read_parquet(out / "speed.parquet")
    want = {"vanilla_tok_s", "candidate_tok_s_min", "speedup", "speedup_max", "vanilla_bound_tok_s",
            "timed_valid_frac", "timed_identical_frac", "timed_first_divergence", "timed_length_ratio", "timed_flag",
            "distinct_prompts"}
    assert want <= set(speed.columns) and not speed["timed_flag"].any()
    assert (speed["timed_identical_frac"] == 1.0).all() and (speed["timed_valid_frac"] == 1.0).all()
    assert "Timed outputs checked against vanilla's" in (out / "speed.md").read_text()
    # DVC's metrics and plot files carry the same numbers
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["timed_flagged"] == 0 and metrics["timed"]["natural-16-single"]["identical_frac"] == 1.0
    assert metrics["timed"]["natural-16-single"]["valid_frac"] == 1.0
    gsm = r.accuracy_of("gsm8k")
    assert metrics["gsm8k"]["delta_points"] == gsm.delta_points and metrics["gsm8k"]["items"] == gsm.items
    first = r.speed[0]
    assert metrics["speedup"][f"{first.workload}-{first.mode}"] == round(first.speedup.median, 4)
    rows = (out / "throughput.csv").read_text().splitlines()
    assert rows[0].startswith("workload,mode,engine,tok_per_s") and len(rows) == 1 + 2 * len(r.speed + r.workloads)


def test_flagged_accuracy_shows_in_every_table(tiny_runs, tmp_path):
    r, _ = tiny_runs
    gsm = r.accuracy_of("gsm8k").model_copy(update={"candidate_acc": 10.0, "vanilla_acc": 50.0,
                                                    "delta_points": -40.0, "flagged": True})
    bad = r.model_copy(update={"accuracy": [gsm]})
    assert "⚠ outside ±3" in accuracy_markdown(bad) and "⚠" in speed_markdown(bad)
    write_tables(bad, tmp_path)
    import pandas as pd

    for name in ("speed", "latency", "workload"):
        assert "⚠ **Accuracy differs" in (tmp_path / f"{name}.md").read_text()
        assert pd.read_parquet(tmp_path / f"{name}.parquet")["accuracy_flag"].all()


def test_speculation_off_reaches_the_engines_and_the_tables(tiny_runs):
    r, _ = tiny_runs
    assert r.config.engine_options()["speculation"] is True and "speculation off" not in speed_markdown(r)
    off = r.model_copy(update={"config": r.config.model_copy(update={"speculation": False})})
    assert off.config.engine_options()["speculation"] is False
    assert speed_markdown(off).startswith("# Throughput vs vanilla E0, speculation off")


def test_plot_chain_speedups_on_a_synthetic_summary(tmp_path):
    import pandas as pd

    df = pd.DataFrame({
        "chain": ["a", "a", "a", "b", "b", "b"],
        "session": [1, 2, 3, 1, 2, 3],
        "retained": [True, False, True, True, True, False],
        "dev_speedup_vs_vanilla": [1.1, 0.9, 1.4, 1.05, 1.5, 1.2],
        "synced_from": [None, None, "b/2", None, "a", None],
    })
    path = plot_chain_speedups(df, tmp_path / "chains.png")
    assert Path(path).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="synced_from"):
        plot_chain_speedups(df.drop(columns=["synced_from"]), tmp_path / "x.png")


# ---- the speed phase under the gate's rules ------------------------------------------------------------------

def test_speed_plan_draws_distinct_prompts_and_shrinks_or_says_so(prepared_dir):
    """Default sizes: 3 reps x (100 + 100 + 8 + 100) GSM8K prompts exceed what fits tiny-qwen3's 512 tokens, so
    the requests per repetition shrink (noted); every timed prompt is new to the process; warm-ups never timed."""
    from seis.postval import prepare_plan, speed_plan

    plan = prepare_plan(make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", device="cpu", max_batch_size=4,
                                    prepared_dir=prepared_dir, gsm8k_items=0, retrieval_items=0))
    sp = speed_plan(plan, 512)
    timed = [p.tokens for ts in sp.sets for rep in ts.reps for p in rep]
    warm = {p.tokens for ts in sp.sets for p in ts.warmup}
    assert len(timed) == len(set(timed)) and not warm & set(timed) and all(ts.distinct for ts in sp.sets)
    assert all(ts.warmup for ts in sp.sets)
    test = next(p for p in sp.pools if p.name == "gsm8k-test")
    assert test.shrunk and test.repeated == 0 and test.timed <= test.available - test.warmup
    sizes = {(ts.workload, ts.mode): (ts.requested, ts.requests) for ts in sp.speed}
    n = sizes[("natural-256", "single")][1]
    assert sizes == {("natural-256", "single"): (100, n), ("natural-256", "batch"): (100, n),
                     ("fixed-256", "single"): (8, 8), ("fixed-256", "batch"): (100, n)}
    assert 3 * (3 * n + 8) <= test.available - test.warmup < 3 * (3 * (n + 1) + 8)  # the most that fits
    assert any("gsm8k-test" in note and "lowered to" in note for note in sp.notes)
    dev = {(ts.workload): ts for ts in sp.workloads if ts.kind == "dev"}
    fitting = [p for p in plan.dev_pool if len(p.tokens) < 512]
    natural = dev["dev-natural"]
    assert natural.reps[0] == fitting[:natural.requests]  # the gate's own dev set (what fits) first
    # A pool that cannot give even one new prompt per repetition: prompts repeat, and the result says so.
    many = prepare_plan(make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", device="cpu", max_batch_size=4,
                                    prepared_dir=prepared_dir, gsm8k_items=0, retrieval_items=0, speed_requests=0,
                                    dev_requests=1, heldout=False, reps=100))
    sp = speed_plan(many, 512)
    pool = next(p for p in sp.pools if p.name == "gsm8k-dev")  # two dev workloads x 100 repetitions x 1 request
    assert pool.repeated == 200 - pool.available > 0 and not any(ts.distinct for ts in sp.workloads)
    assert any("repeat" in note for note in sp.notes)


def test_timed_prompts_carry_a_tag_of_the_runs_nonce_before_the_question_and_accuracy_prompts_do_not(prepared_dir):
    """The GSM8K questions are public: every timed prompt (test and dev pools) carries its own tag of the run's
    nonce, first thing in the user turn after the instruction, so an engine can neither ship its answer nor a
    question's prefix, nor rebuild other prompts from one it sees; the accuracy prompts stay the questions as they
    are. The nonce is recorded, and drawn afresh when not given."""
    from seis.postval import prepare_plan
    from seis.postval.accuracy import gsm8k_prompts

    def plan(nonce):
        return prepare_plan(make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", device="cpu",
                                        prepared_dir=prepared_dir, gsm8k_items=4, retrieval_items=0,
                                        speed_requests=4, prompt_nonce=nonce))

    a, b = plan("0123abcd"), plan("fedc9876")
    assert a.prompt_nonce == "0123abcd" and len(plan(None).prompt_nonce) == 16
    assert a.gsm8k_prompts == b.gsm8k_prompts == gsm8k_prompts(a.tokenizer, a.gsm8k_items)
    for pool_a, pool_b in ((a.test_pool, b.test_pool), (a.dev_pool, b.dev_pool)):
        assert pool_a and [p.id for p in pool_a] == [p.id for p in pool_b]
        texts = [a.tokenizer.decode(list(p.tokens)) for p in pool_a]
        tags = [re.findall(r"\(request ([0-9a-f]{16})\)", t) for t in texts]
        # each prompt its own tag, twice; the run's nonce, from which every tag follows, in none
        assert all(len(t) == 2 and t[0] == t[1] for t in tags)
        assert len({t[0] for t in tags}) == len({p.id for p in pool_a})  # one tag per question
        assert not any("0123abcd" in t for t in texts)
    # what the same question shares across nonces ends inside its first tag, before anything of the question
    for x, y in zip(a.test_pool, b.test_pool):
        before, _, tag = a.tokenizer.decode(list(x.tokens[:_common(x.tokens, y.tokens)])).partition("(request ")
        assert "Question:" in before and "(request" not in before and ")" not in tag


def _common(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class _Box:
    def __init__(self, log: list, name: str):
        self.log, self.name, self.frozen, self.ran = log, name, False, False

    def freeze(self):
        self.frozen = True
        self.log.append(("freeze", self.name))

    def thaw(self) -> bool:
        """Whether the sandbox ran while frozen (`ran`: as if it had the kernel resume it)."""
        self.frozen = False
        self.log.append(("thaw", self.name))
        return self.ran


class _Engine:
    """Answers like a greedy engine would, and records whether the other engine was frozen meanwhile."""

    def __init__(self, log: list, name: str):
        self.box, self.log, self.name, self.other = _Box(log, name), log, name, None
        self.engine_dir = name

    def generate(self, prompts, sampling):
        self.log.append(("generate", self.name, self.other.box.frozen, self.box.frozen))
        return [{"token_ids": [p[0]] * sampling.max_new_tokens, "finish_reason": "length"} for p in prompts]


def test_the_other_engine_is_frozen_while_one_is_timed():
    from seis.engine_host.client import Sampling
    from seis.postval.bandwidth import EnergyMeter

    log: list = []
    engines = {"candidate": _Engine(log, "candidate"), "vanilla": _Engine(log, "vanilla")}
    engines["candidate"].other, engines["vanilla"].other = engines["vanilla"], engines["candidate"]
    timings = measure_pair(engines, [[[1], [2]], [[3]]], Sampling(max_new_tokens=4), "single", EnergyMeter("cpu"))
    calls = [e for e in log if e[0] == "generate"]
    assert len(calls) == 6 and all(other_frozen and not self_frozen for _, _, other_frozen, self_frozen in calls)
    assert [c[1] for c in calls] == ["candidate"] * 2 + ["vanilla"] * 2 + ["vanilla", "candidate"]  # A B, B A
    assert not any(e.box.frozen for e in engines.values())  # thawed afterwards
    assert [t.tokens for t in timings["candidate"]] == [8, 4] and timings["vanilla"][1].outputs == [[3] * 4]
    with pytest.raises(RuntimeError), alone(engines, "candidate"):
        raise RuntimeError("an engine error while timed")
    assert not engines["vanilla"].box.frozen  # thawed on errors too


def test_an_engine_that_ran_while_frozen_fails_the_candidate_or_the_host_never_passes_unnoticed():
    """thaw() says whether a frozen sandbox ran meanwhile (it can have the kernel resume it): a candidate that did
    may have slowed vanilla's timed requests, so it fails as any misbehaving candidate does (EngineError); vanilla
    is trusted, so its running is a host failure, never the candidate's failure or win."""
    from seis.engine_host import EngineError
    from seis.evaluator import HostFailure
    from seis.postval.run import time_sets

    log: list = []
    engines = {"candidate": _Engine(log, "candidate"), "vanilla": _Engine(log, "vanilla")}
    engines["candidate"].box.ran = True
    with alone(engines, "candidate"):  # the candidate was not frozen: nothing to say
        pass
    with pytest.raises(EngineError, match="candidate: its processes ran while it was frozen"), \
            alone(engines, "vanilla"):
        pass
    engines["candidate"].box.ran, engines["vanilla"].box.ran = False, True
    with pytest.raises(HostFailure, match="vanilla is trusted"), alone(engines, "candidate"):
        pass
    assert not any(e.box.frozen for e in engines.values())
    # so is running while both are frozen for their threads to be listed and pinned, before the timed sets
    engines["candidate"].box.ran, engines["vanilla"].box.ran = True, False
    for e in engines.values():
        e.pids = lambda: []
    with pytest.raises(EngineError, match="candidate: its processes ran while it was frozen"):
        time_sets(engines, [], object, lambda ts: None)
    assert not any(e.box.frozen for e in engines.values())


# The candidate has the kernel resume it while frozen: a POSIX timer whose signal is SIGCONT (handled: recent kernels
# park a timer whose signal is ignored), every 5 ms, and a thread that wakes every 1 ms and arms it again.
WAKES_WHILE_FROZEN = """
import ctypes as _adv_ctypes
import signal as _adv_signal
import threading as _adv_threading
import time as _adv_time


class _AdvEvent(_adv_ctypes.Structure):
    _fields_ = [("value", _adv_ctypes.c_void_p), ("signo", _adv_ctypes.c_int), ("notify", _adv_ctypes.c_int),
                ("pad", _adv_ctypes.c_byte * 48)]


class _AdvSpec(_adv_ctypes.Structure):
    _fields_ = [("interval", _adv_ctypes.c_long * 2), ("value", _adv_ctypes.c_long * 2)]


_adv_signal.signal(_adv_signal.SIGCONT, lambda *_: None)  # handled, so the timer keeps firing
_adv_libc = _adv_ctypes.CDLL(None, use_errno=True)
_adv_event, _adv_timer = _AdvEvent(signo=_adv_signal.SIGCONT, notify=0), _adv_ctypes.c_void_p()  # SIGEV_SIGNAL
assert _adv_libc.timer_create(1, _adv_ctypes.byref(_adv_event), _adv_ctypes.byref(_adv_timer)) == 0
_adv_every = (_adv_ctypes.c_long * 2)(0, 5_000_000)
assert _adv_libc.timer_settime(_adv_timer, 0, _adv_ctypes.byref(_AdvSpec(_adv_every, _adv_every)), None) == 0


def _adv_tick():  # armed again whenever it runs: a SIGSTOP that finds the timer's SIGCONT pending can park it
    while True:
        _adv_libc.timer_settime(_adv_timer, 0, _adv_ctypes.byref(_AdvSpec(_adv_every, _adv_every)), None)
        _adv_time.sleep(0.001)


_adv_threading.Thread(target=_adv_tick, daemon=True).start()
"""


def test_a_candidate_that_runs_while_frozen_fails_post_validation(tmp_path, prepared_dir):
    """SIGSTOP does not hold a process that has the kernel send it SIGCONT: such a candidate ran beside vanilla's
    timed requests (it could slow them and so inflate its own ratio) with nothing noticed. It fails."""
    from seis.engine_host import EngineError

    cand = hostile(tmp_path / "wakes", WAKES_WHILE_FROZEN)
    # 64-token timed requests: the engine is frozen for each of vanilla's, and a window shorter than its 5 ms timer
    # (16 tokens of a two-layer model, on an idle machine) can pass without a wake-up. On a loaded machine the
    # timer's SIGCONT can still be pending when a freeze discards it, parking the timer for that window; twice in
    # full runs no window of one run woke it. So up to three runs: the probe must wake in one, and be caught.
    for attempt in range(3):
        out = tmp_path / f"out-{attempt}"
        try:
            run_post_validation(make_config(engine_dir=cand, out_dir=out, prepared_dir=prepared_dir,
                                            **dict(HOSTILE, gsm8k_items=0, dev_requests=0, heldout=False,
                                                   bandwidth_gbs=10.0, natural_max_new_tokens=64,
                                                   fixed_new_tokens=64)))
        except EngineError as e:  # caught running after a freeze, or waking so often that no freeze held it
            assert "ran while it was frozen" in str(e) or "did not stay frozen" in str(e), e
            assert not (out / "postval.json").exists()
            return
    pytest.fail("the candidate that wakes itself while frozen passed post-validation three times")


def test_warm_ups_run_on_every_cpu_and_only_the_timed_sets_share_one(engine_pid):
    """First calls compile kernels (FlashInfer's JIT runs nvcc and ninja, which inherit the caller's CPU mask):
    warm-ups must not be pinned; the timed sets are, all engines on one CPU, and the masks come back after."""
    from types import SimpleNamespace

    from seis.engine_host.client import Sampling
    from seis.postval.run import time_sets

    everywhere = os.sched_getaffinity(engine_pid)
    log: list = []
    engines = {"candidate": _Engine(log, "candidate"), "vanilla": _Engine(log, "vanilla")}
    engines["candidate"].other, engines["vanilla"].other = engines["vanilla"], engines["candidate"]
    warm_masks: list[set[int]] = []
    for e in engines.values():
        e.pids = lambda: [engine_pid]
        answer = e.generate
        e.generate = lambda prompts, s, answer=answer: warm_masks.append(os.sched_getaffinity(engine_pid)) or \
            answer(prompts, s)
    sets = [SimpleNamespace(warmup=[SimpleNamespace(tokens=(1, 2))]), SimpleNamespace(warmup=[])]
    timed, cpu = time_sets(engines, sets, Sampling, lambda ts: os.sched_getaffinity(engine_pid))
    assert len(warm_masks) == 4 and all(m == everywhere for m in warm_masks)  # 2 warm-up calls per engine, one set
    assert cpu in os.sched_getaffinity(0) and timed == [{cpu}, {cpu}]  # the highest CPU no other timing holds
    assert os.sched_getaffinity(engine_pid) == everywhere


def test_each_timed_pass_starts_on_an_idle_gpu():
    """A frozen engine's queued kernels still run: every pass waits for the GPU first (after the other engine is
    frozen), and passes that began on a GPU still busy after the wait's limit flag their row."""
    from seis.engine_host.client import Sampling
    from seis.postval.bandwidth import EnergyMeter

    log: list = []

    class Idle:
        never_idle = 0

        def wait(self):
            log.append(("idle", engines["candidate"].box.frozen or engines["vanilla"].box.frozen))

    engines = {"candidate": _Engine(log, "candidate"), "vanilla": _Engine(log, "vanilla")}
    engines["candidate"].other, engines["vanilla"].other = engines["vanilla"], engines["candidate"]
    measure_pair(engines, [[[1]], [[2]]], Sampling(max_new_tokens=4), "single", EnergyMeter("cpu"), Idle())
    order = [e[0] for e in log if e[0] in ("idle", "generate")]
    assert order == ["idle", "generate"] * 4 and all(e[1] for e in log if e[0] == "idle")  # waited while frozen


def test_a_row_timed_on_a_busy_gpu_is_flagged(tiny_runs):
    r, _ = tiny_runs
    assert all(c.gpu_busy_passes == 0 for c in r.speed)   # CPU: nothing else can hold the device
    busy = r.model_copy(update={"speed": [r.speed[0].model_copy(update={"gpu_busy_passes": 2})] + r.speed[1:]})
    assert "⚠ not trustworthy: 2 passes began while the GPU still ran the other engine's work" in speed_markdown(busy)


def _timing(outputs, finish=None) -> Timing:
    return Timing(wall_s=1.0, latencies=[1.0], outputs=outputs, finish=finish or ["stop"] * len(outputs),
                  energy_j=None, tokens=sum(len(o or []) for o in outputs))


EOS, JUNK = 99, 50  # the scripted vanilla below: ids >= JUNK (but EOS) lie 1 nat below its top-1


class _Scorer:
    """Vanilla's score call, scripted: every forced token is its own top-1 except ids >= JUNK (1 nat below) and an
    EOS (stop_gap nats below); or a fixed reply. Records calls."""
    engine_dir = "vanilla"

    def __init__(self, reply=None, stop_gap: float = 0.0):
        self.calls, self.reply, self.stop_gap = [], reply, stop_gap

    def score(self, prompts, continuations, top_k):
        self.calls.append((prompts, continuations, top_k))
        if self.reply is not None:
            return self.reply
        gap = {EOS: self.stop_gap}
        return [{"token_logprobs": [-1.0 - gap.get(t, 1.0 if t >= JUNK else 0.0) for t in c],
                 "top_ids": [[0]] * len(c), "top_logprobs": [[-1.0]] * len(c)} for c in continuations]


def _judged(cand: list[Timing], van: list[Timing], max_new: int = 4, natural: bool = True, stop_gap: float = 0.0,
            length_tolerance: float = 0.10):
    from seis.engine_host.client import Sampling
    from seis.postval.postval_config import PostValConfig
    from seis.postval.speed import VanillaScorer, judge_timed, timed_rules

    config = PostValConfig.model_construct(timed_min_valid=0.97, timed_margin=0.3,
                                           timed_length_tolerance=length_tolerance)
    rules = timed_rules(config, [EOS], 1.0, 100, 4096)
    prompts = [[[7 + i] for i in range(len(t.outputs))] for t in cand]
    sampling = Sampling(max_new_tokens=max_new, ignore_eos=not natural)
    checks = judge_timed(VanillaScorer(_Scorer(stop_gap=stop_gap)), "w", prompts, sampling,
                         {"candidate": cand, "vanilla": van}, rules)
    return timed_check(cand, van, max_new, checks)


def test_timed_outputs_are_judged_by_the_gates_timed_checks():
    van = [_timing([[1, 2, 3, EOS], [5, 6, 7, EOS]])]
    same = _judged([_timing([[1, 2, 3, EOS], [5, 6, 7, EOS]])], van)
    assert (same.identical_frac, same.valid_frac, same.first_divergence_mean, same.length_ratio, same.flagged) == \
        (1.0, 1.0, 4.0, 1.0, False)
    assert {c.name for c in same.checks} >= {"timed.w.greedy_valid", "timed.w.stops", "timed.w.early_ends"}
    # parted at a near-tie: not identical, every token still vanilla's choice up to the margin
    tie = _judged([_timing([[1, 2, 3, EOS], [5, 9, 7, EOS]])], van)
    assert (tie.identical_frac, tie.first_divergence_mean, tie.flagged) == (0.5, 2.5, False), tie.reasons
    fixed = [_timing([[1, 2, 3, 4], [5, 6, 7, 8]], ["length"] * 2)]
    junk = _judged([_timing([[JUNK] * 4, [JUNK] * 4], ["length"] * 2)], fixed, natural=False)
    assert junk.flagged and junk.valid_frac == 0.0 and "top-1" in junk.reasons[0]
    hundred = [_timing([[1] * 100], ["length"])]
    edge = _judged([_timing([[1] * 97 + [JUNK] * 3], ["length"])], hundred, max_new=100, natural=False)
    assert not edge.flagged and edge.valid_frac == 0.97  # at the line
    assert _judged([_timing([[1] * 96 + [JUNK] * 4], ["length"])], hundred, max_new=100, natural=False).flagged
    padded = _judged([_timing([[1, 2, 3, 4, 0, 0], None], ["length", "missing"])], fixed, natural=False)
    assert padded.flagged and (padded.over_length, padded.missing) == (1, 1)


def test_a_timed_output_cut_short_is_flagged_by_length_and_stop_rules():
    van = [_timing([[1, 2, 3, EOS], [5, 6, 7, EOS]])]
    cut = _judged([_timing([[1, 2, 3, EOS], [5, 6]], ["stop", "length"])], van)  # a prefix, no stop
    assert cut.flagged and any(r.startswith("lengths:") for r in cut.reasons), cut.reasons
    fake = _judged([_timing([[1, 2, 3, EOS], [5, 6, 7]])], van)  # "stop" without an EOS
    assert fake.flagged and any(r.startswith("eos:") for r in fake.reasons), fake.reasons
    # an EOS 2 nats below vanilla's top-1 is not a near-tie: beyond the stop margin (0.75 here)
    far = _judged([_timing([[1, 2, 3, EOS], [5, EOS]])], van, stop_gap=2.0)
    assert far.flagged and any(r.startswith("stops:") for r in far.reasons), far.reasons
    assert not _judged([_timing([[1, 2, 3, EOS], [5, EOS]])], van, stop_gap=0.25).flagged  # a near-tie stop


def test_early_ends_at_near_ties_are_flagged_when_they_go_one_way():
    """Each stop a near-tie (0.25 nats, within the margin): one engine ending early on 4 requests and late on 4 is
    rounding; one ending early on all 8 is an engine that takes EOS wherever it may."""
    van = [_timing([[1, 2, 3, 4, 5, EOS]] * 8)]
    early, late = [1, 2, EOS], [1, 2, 3, 4, 5, 6, 7, EOS]
    both = _judged([_timing([early] * 4 + [late] * 4)], van, max_new=8, stop_gap=0.25)
    assert not both.flagged, both.reasons
    one_way = _judged([_timing([early] * 8)], van, max_new=8, stop_gap=0.25)
    assert one_way.flagged and len(one_way.reasons) == 1, one_way.reasons  # every other rule holds
    assert one_way.reasons[0].startswith("early_ends:") and "on 8 and after it on 0" in one_way.reasons[0]
    # at fixed length nothing ends by choice: no such check
    fixed = [_timing([[1, 2, 3, 4, 5, 6]] * 8, ["length"] * 8)]
    assert "timed.w.early_ends" not in {c.name for c in _judged(fixed, fixed, max_new=6, natural=False).checks}


def test_vanillas_malformed_score_replies_are_errors():
    from seis.engine_host import EngineError
    from seis.postval.speed import VanillaScorer

    def score(reply):
        return VanillaScorer(_Scorer(reply)).score([[8], [10]], [[1, 9, 2], [2, 2, 2]], 1)

    assert [s.token_logprobs for s in VanillaScorer(_Scorer()).score([[8]], [[1, JUNK]], 1)] == [[-1.0, -2.0]]
    with pytest.raises(EngineError, match="malformed score reply"):
        score([{"token_logprobs": [0.0]}] * 2)
    short = {"token_logprobs": [0.0], "top_ids": [[0]], "top_logprobs": [[0.0]]}  # one position for three tokens
    with pytest.raises(EngineError, match="for 3 tokens"):
        score([short] * 2)
    with pytest.raises(EngineError, match="with 1"):
        score([{}])


def _speedups(r: PostValResult) -> list[float]:
    return [c.speedup.median for c in r.speed + r.workloads]


HOSTILE = dict(TINY, gsm8k_items=2, retrieval_items=0, figures=False)


def test_an_output_cache_gains_nothing(tmp_path, prepared_dir):
    """A candidate that caches (prompt, sampling) -> output, in memory and in its compile cache: the speed phase's
    processes and caches are fresh, so the accuracy prompts never reach them, and no repetition or mode repeats a
    prompt: no timed request hits."""
    cand = hostile(tmp_path / "cache", OUTPUT_CACHE)
    r = run_post_validation(make_config(engine_dir=cand, out_dir=tmp_path / "out", prepared_dir=prepared_dir,
                                        bandwidth_gbs=10.0, **HOSTILE))
    after = r.engines["candidate"].stats["after"]  # hits per max_new_tokens (the host keeps flat stats only)
    hits = {k.removeprefix("adv_cache_hits_"): v for k, v in after.items() if k.startswith("adv_cache_hits_")}
    timed_lengths = {str(c.max_new_tokens) for c in r.speed + r.workloads}
    assert not timed_lengths & set(hits), hits  # only the (untimed, 8-token) warm-ups repeat
    # what it kept in its compile cache during the accuracy phase never reached the speed phase, nor vanilla's cache
    assert r.engines["candidate"].stats["after"]["adv_cache_loaded"] == 0
    assert not list((cache_dir() / "engine-cache").rglob(ADV_CACHE_FILE))
    assert statistics.geometric_mean(_speedups(r)) < 1.5  # cached answers would be many times faster
    assert not r.timed_flagged and all(c.timed.identical_frac == 1.0 and c.timed.valid_frac == 1.0
                                       for c in r.speed + r.workloads)


def test_a_fast_broken_single_request_path_is_flagged(tmp_path, prepared_dir):
    """Single-prompt generates (the timed latency path) skip layers; the batched accuracy calls are fine."""
    cand = hostile(tmp_path / "fast1", BATCH_OF_ONE)
    r = run_post_validation(make_config(engine_dir=cand, out_dir=tmp_path / "out", prepared_dir=prepared_dir,
                                        **dict(HOSTILE, gsm8k_items=0, dev_requests=0, heldout=False,
                                               bandwidth_gbs=10.0)))
    flagged = {(c.workload, c.mode) for c in r.speed if c.timed_flagged}
    assert flagged == {("natural-16", "single"), ("fixed-16", "single")}
    assert r.timed_flagged and any("not trustworthy" in f for f in r.flags)
    single = next(c for c in r.speed if (c.workload, c.mode) == ("fixed-16", "single"))
    assert single.timed.identical_frac < 0.5 and single.timed.first_divergence_mean < 16
    assert single.timed.valid_frac < 0.97 and "top-1" in single.timed.reasons[0]
    out = Path(r.config.out_dir)
    assert "not trustworthy" in (out / "speed.md").read_text()
    import pandas as pd

    df = pd.read_parquet(out / "speed.parquet")
    assert set(df[df["timed_flag"]]["mode"]) == {"single"}
    assert json.loads((out / "metrics.json").read_text())["timed_flagged"] == 1


WRONG_DTYPE = """
_adv_stats_dtype = Engine.stats
Engine.stats = lambda self: {**_adv_stats_dtype(self), "dtype": "float64"}
"""


def test_a_candidate_that_misstates_its_dtype_gets_the_bound_of_the_dtype_it_was_asked_for(tmp_path, prepared_dir):
    """The bandwidth bound is the candidate's word no more than its context is: one that says float64 while it
    runs float32 had its bound halved (its share of it doubled) under the bound of what it said it runs."""
    cand = hostile(tmp_path / "dtype", WRONG_DTYPE)
    r = run_post_validation(make_config(engine_dir=cand, out_dir=tmp_path / "out", prepared_dir=prepared_dir,
                                        **dict(HOSTILE, gsm8k_items=0, heldout=False, bandwidth_gbs=10.0)))
    assert r.bandwidth.dtype == {"candidate": "float32", "vanilla": "float32"}
    assert r.bandwidth.weight_bytes["candidate"] == r.bandwidth.weight_bytes["vanilla"]
    assert any("candidate says it runs float64, asked float32" in n for n in r.notes)


SHORT_CONTEXT = """
_adv_stats_ctx = Engine.stats
Engine.stats = lambda self: {**_adv_stats_ctx(self), "max_seq_len": 1}
"""


def test_a_candidate_that_says_it_serves_a_tiny_context_is_flagged_not_waved_through(tmp_path, prepared_dir):
    """The candidate's stats are its word: one that says it serves 1 token of context (and serves everything) made
    every prompt too long for both engines, so nothing was measured and nothing was flagged."""
    cand = hostile(tmp_path / "short", SHORT_CONTEXT)
    r = run_post_validation(make_config(engine_dir=cand, out_dir=tmp_path / "out", prepared_dir=prepared_dir,
                                        **dict(HOSTILE, bandwidth_gbs=10.0)))
    assert r.context_tokens == 1 and r.vanilla_context_tokens == 512 and r.context_flagged
    assert r.flags and "1 tokens" in r.flags[0] and "vanilla 512" in r.flags[0]
    out = Path(r.config.out_dir)
    for table in ("accuracy.md", "speed.md", "workload.md", "latency.md"):
        assert "measured on neither engine" in (out / table).read_text(), table
    assert json.loads((out / "postval.json").read_text())["flags"] == r.flags


# ---- bad input ------------------------------------------------------------------------------------------------

def test_library_rejects_bad_input_before_any_work(tmp_path, prepared_dir):
    with pytest.raises(PostValError, match="reps"):
        make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", reps=0)
    with pytest.raises(PostValError, match="device") as bad_device:
        make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", device="tpu")
    assert str(bad_device.value).count("got 'tpu'") == 1  # the validator's message names it already
    with pytest.raises(PostValError, match="does not exist"):
        run_post_validation(make_config(engine_dir=tmp_path / "nope", model="tiny-qwen3", out_dir=tmp_path / "o"))
    with pytest.raises(PostValError, match="max-batch-size"):  # two KV caches larger than any RAM
        run_post_validation(make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", device="cpu",
                                        max_batch_size=10**9, out_dir=tmp_path / "o", prepared_dir=prepared_dir))
    with pytest.raises(PostValError, match="prepared"):
        run_post_validation(make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", device="cpu",
                                        out_dir=tmp_path / "o", prepared_dir=tmp_path / "empty"))
    assert not (tmp_path / "o").exists()  # nothing was written


@pytest.mark.parametrize("gpus, device, says", [(0, "cuda", "no usable CUDA GPU"), (0, "cuda:0", "no usable CUDA GPU"),
                                                  (2, "cuda:2", "GPUs 0 to 1")])
def test_a_device_the_machine_lacks_is_bad_input_not_an_engine_failure(monkeypatch, tmp_path, prepared_dir, gpus,
                                                                        device, says):
    """--device cuda (or cuda:N past the GPUs there are) is refused before any work: it was let through, both
    engines failed to build after the prompts were made, and the CLI said "engine failed during post-validation"
    (exit 1), blaming the engine for the operator's flag."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(PostValError, match=f"--device {device}: this machine has {says}"):
        run_post_validation(make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", device=device,
                                        out_dir=tmp_path / "o", prepared_dir=prepared_dir))
    assert not (tmp_path / "o").exists()


def test_default_context_is_lowered_to_what_two_kv_caches_fit(monkeypatch):
    from seis.models import resolve_model
    from seis.postval import plan as plan_mod

    model_dir = resolve_model("tiny-qwen3")
    per_tok = kv_bytes_per_token(model_dir, "float32")
    weights = weight_bytes_per_token(model_dir, "float32")

    def plan(**values) -> plan_mod.Plan:  # a long-context model whose suite wants 25,600 tokens
        config = make_config(engine_dir=ENGINE_TEMPLATE, model="tiny-qwen3", device="cpu", max_batch_size=4, **values)
        return plan_mod.Plan(config=config, model_dir=model_dir, model_context=40960, vocab_size=320, tokenizer=None,
                             suite_context=25600)

    # Free memory for two caches of 4 x 8,500 tokens (plus the weights' share): the context drops to 8,192.
    free = (2 * (2 * weights + 2**31) + 2 * per_tok * 4 * 8500) / 0.8
    monkeypatch.setattr(plan_mod, "available_ram_bytes", lambda: free)
    p = plan()
    plan_mod._fit_memory(p)
    assert p.context == 8192 and "context lowered from 25600 to 8192" in p.notes[0]
    with pytest.raises(PostValError, match="--max-batch-size or --max-seq-len"):  # explicit: never changed
        plan_mod._fit_memory(plan(max_seq_len=16384))
    roomy = plan()
    monkeypatch.setattr(plan_mod, "available_ram_bytes", lambda: 1000 * free)
    plan_mod._fit_memory(roomy)
    assert roomy.context == 25600 and not roomy.notes


def seis(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seis.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.mark.parametrize("args, message", [
    (["--engine", "/no/such/engine", "--model", "tiny-qwen3"], "does not exist"),
    (["--engine", str(ENGINE_TEMPLATE), "--model", "no-such-model"], "no-such-model"),
    (["--engine", str(ENGINE_TEMPLATE), "--model", "tiny-qwen3", "--gsm8k-items", "-1"], "--gsm8k-items"),
    (["--engine", str(ENGINE_TEMPLATE), "--model", "tiny-qwen3", "--reps", "0"], "--reps"),
    (["--engine", str(ENGINE_TEMPLATE), "--model", "tiny-qwen3", "--retrieval-items", "100000"], "270"),
    (["--engine", str(ENGINE_TEMPLATE), "--model", "tiny-qwen3", "--device", "gpu"], "device"),
    (["--model", "tiny-qwen3"], "exactly one of --engine"),
    (["--engine", str(ENGINE_TEMPLATE), "--snapshot", "abc", "--model", "tiny-qwen3"], "exactly one of --engine"),
    (["--snapshot", "0123456789abcdef", "--model", "tiny-qwen3", "--store-root", "/no/such/store"], "snapshot"),
])
def test_cli_bad_input_exits_2_with_a_clear_message(args, message, tmp_path, prepared_dir):
    out = seis("post-validate", "--out", str(tmp_path / "out"), "--prepared-dir", str(prepared_dir), *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_quick_run_on_tiny_qwen3(tmp_path, e0_copy, prepared_dir):
    out = seis("post-validate", "--engine", str(e0_copy), "--model", "tiny-qwen3", "--quick", "--device", "cpu",
               "--cpu-threads", "1", "--out", str(tmp_path / "pv"), "--prepared-dir", str(prepared_dir),
               "--gsm8k-items", "4", "--speed-requests", "2", "--dev-requests", "0", "--reps", "2",
               "--bandwidth-gbs", "10")
    assert out.returncode == 0, out.stderr
    assert "# Accuracy vs vanilla" in out.stdout and "# Throughput vs vanilla" in out.stdout
    result = PostValResult.model_validate_json((tmp_path / "pv" / "postval.json").read_text())
    assert result.config.quick and result.config.gsm8k_items == 4 and result.config.retrieval_items == 9
    assert result.accuracy_of("gsm8k").delta_points == 0.0


# ---- real weights ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_gsm8k_and_retrieval_e0_copy(tmp_path, e0_copy, prepared_dir):
    """Real outputs: extraction and scoring agree with the workload functions; the copy of E0 matches E0."""
    r = run_post_validation(make_config(
        engine_dir=e0_copy, model="smollm2-135m-instruct", out_dir=tmp_path, prepared_dir=prepared_dir,
        device="cpu", cpu_threads=1, gsm8k_items=2, gsm8k_max_new_tokens=64, retrieval_items=2,
        speed_requests=0, dev_requests=0, heldout=False, max_seq_len=1024, max_batch_size=4, figures=False))
    gsm, ret = r.accuracy_of("gsm8k"), r.accuracy_of("retrieval")
    assert (gsm.items, gsm.skipped, ret.items, ret.skipped) == (2, 0, 2, 0)
    assert gsm.delta_points == 0.0 and ret.delta_points == 0.0 and gsm.identical_outputs == 2
    for it in r.items:
        assert it.text.strip() and it.output_tokens > 0
        if it.task == "gsm8k":
            assert it.extracted == extract_answer(it.text) and it.correct == is_correct(it.text, it.gold)
        else:
            assert it.correct == score_retrieval(it.text, it.gold)
    # SmolLM2 finds a pass code in a ~300-token document: the prompt, template and decoding are right.
    assert ret.vanilla_acc >= 50.0
    assert r.speed == [] and r.workloads == [] and r.bandwidth is None
    assert statistics.fmean(i.prompt_tokens for i in r.items if i.task == "gsm8k") > 50


def test_reports_say_which_attention_vanilla_ran_and_warn_when_it_is_not_flashinfer_where_installed(monkeypatch):
    import importlib.util

    from seis.engine_host.attention import baseline_attention as vanilla_backend_note

    real = importlib.util.find_spec
    installed = {"flashinfer": True}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if installed[name] else None) if name == "flashinfer"
                        else real(name, *a))
    fell_back = vanilla_backend_note({"attention_backend": "triton"}, "cuda")
    assert fell_back.startswith("vanilla E0's attention backend: triton although flashinfer is installed here")
    assert vanilla_backend_note({"attention_backend": "flashinfer"}, "cuda") == \
        "vanilla E0's attention backend: flashinfer"
    assert vanilla_backend_note({"attention_backend": "torch"}, "cpu") == "vanilla E0's attention backend: torch"
    installed["flashinfer"] = False
    assert vanilla_backend_note({"attention_backend": "triton"}, "cuda") == "vanilla E0's attention backend: triton"
    assert vanilla_backend_note({"attention_backend": 3}, "cuda") is None and vanilla_backend_note({}, "cuda") is None


def test_fixed_single_requests_are_at_most_the_speed_requests_they_are_taken_from() -> None:
    """--fixed-single-requests 500 --speed-requests 10 was accepted and timed 114 single requests, though the
    fixed-length ones are the first of the speed requests; left to its default, the count follows a smaller pool."""
    base = {"engine_dir": ENGINE_TEMPLATE, "model": "tiny-qwen3"}
    with pytest.raises(PostValError, match=r"fixed_single_requests \(500\) are the first of the speed_requests \(10\)"):
        make_config(**base, speed_requests=10, fixed_single_requests=500)
    assert make_config(**base, speed_requests=4).fixed_single_requests == 4
    assert make_config(**base, quick=True, speed_requests=1).fixed_single_requests == 1
    assert make_config(**base, speed_requests=10, fixed_single_requests=10).fixed_single_requests == 10
