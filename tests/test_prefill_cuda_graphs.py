"""The `prefill-cuda-graphs` library entry on CPU: the padded single-prompt prefill that its graphs capture, run
eagerly on tiny-qwen3, gives E0's last-row logits and writes E0's K/V for every prompt row, touches nothing but
the prompt's slots and the padding page, and is used only for what it can replay (one fresh prompt that fits).
Through the engine's own prefill, greedy tokens equal E0's. The check runs in a child process that hosts the
candidate's engine (tests/interpreted.py); CUDA graphs themselves are checked in tests/gpu.
"""
from __future__ import annotations

from interpreted import run_interpreted
from seis.agents.offline.library import load_library
from seis.agents.offline.verify import build_candidate

CHECK = r'''
import sys

import torch

from seis.engine_import import import_engine
from seis.models import resolve_model

E = import_engine(sys.argv[1])
from engine.prefill_graph import PrefillGraphs, graph_sizes

assert graph_sizes(100, smallest=8) == [8, 12, 16, 24, 32, 48, 64, 96, 100]
assert graph_sizes(4096) [-3:] == [2048, 3072, 4096]

eng = E.Engine(resolve_model("tiny-qwen3"), E.EngineOptions(device="cpu", max_batch_size=4, max_seq_len=128,
                                                             page_size=4)).build()
assert eng.prefill_graphs is None  # no CUDA: E0's eager prefill
cfg = eng.config
sizes = [8, 12, 16, 24]
padded = PrefillGraphs(lambda batch, attn: eng.model.forward(batch, attn, eng.kv), cfg.num_heads,
                       cfg.num_kv_heads, cfg.head_dim, sizes, eng.device, use_graphs=False)
g = torch.Generator().manual_seed(0)
ps = eng.options.page_size


def fresh_batch(prompts, all_rows=False):
    reqs = [eng._new_request(i, p, E.SamplingParams(max_new_tokens=4)) for i, p in enumerate(prompts)]
    for r in reqs:
        eng._admit(r, r.max_total_len)
    return reqs, eng._extend_batch([(r, r.prompt, 0) for r in reqs], all_rows=all_rows)


def cache():
    return [t.clone() for t in eng.kv.k + eng.kv.v]


for n in (1, 5, 8, 11, 16, 17, 24):
    prompt = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
    (r,), batch = fresh_batch([prompt])
    want = eng._forward(batch)
    slots = batch.out_slots
    want_kv = [t.index_select(0, slots) for t in cache()]
    for t in eng.kv.k + eng.kv.v:  # what the padded prefill must write again
        t.index_fill_(0, slots, float("nan"))
    before = cache()
    got = padded.run(batch)
    assert got is not None and got.shape == want.shape, n
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"{n} tokens")
    after = cache()
    outside = torch.ones(before[0].shape[0], dtype=torch.bool)
    outside[slots] = False
    outside[:ps] = False  # the reserved padding page
    for b, a, w in zip(before, after, want_kv):
        torch.testing.assert_close(a.index_select(0, slots), w, atol=1e-5, rtol=1e-5, msg=f"K/V, {n} tokens")
        assert torch.equal(a[outside], b[outside]), f"{n} tokens: wrote outside its slots and page 0"
    eng._release(r)
assert padded.replays == 7

# Not for the padded graphs: longer than the largest, two prompts, every row's logits (scoring), a cached prefix.
for prompts, all_rows in (([list(range(1, 26))], False), ([[1, 2, 3], [4, 5]], False), ([[1, 2, 3]], True)):
    reqs, batch = fresh_batch(prompts, all_rows)
    assert padded.run(batch) is None, (prompts, all_rows)
    for r in reqs:
        eng._release(r)
(r,), _ = fresh_batch([[1, 2, 3, 4, 5, 6]])
assert padded.run(eng._extend_batch([(r, [5, 6], 4)], all_rows=False)) is None
eng._release(r)
assert padded.replays == 7

# The engine's own prefill through them: E0's greedy tokens.
prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 20, 30)]
sp = E.SamplingParams(max_new_tokens=12, ignore_eos=True)
want = [[o.token_ids for o in eng.generate([p], sp)] for p in prompts]
eng.prefill_graphs = padded
got = [[o.token_ids for o in eng.generate([p], sp)] for p in prompts]
assert got == want, (got, want)
assert padded.replays == 7 + 3 and eng.stats()["prefill_graph_replays"] == 10  # the 30-token prompt: eager
print("padded prefill ok")
'''


def test_padded_fresh_prompt_prefill_matches_e0(tmp_path):
    t = next(t for t in load_library() if t.name == "prefill-cuda-graphs")
    candidate = build_candidate(tmp_path / "candidate", [t])
    assert "padded prefill ok" in run_interpreted(CHECK, candidate, tmp_path)
