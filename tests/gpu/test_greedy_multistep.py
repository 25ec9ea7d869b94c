"""GPU checks of the `greedy-multistep-decode` library entry: its compiled argmax-and-advance kernel against
torch.argmax at Qwen3's vocabulary (ties across and inside chunks) inside a replayed CUDA graph, and an fp32
engine with the entry keeps E0's greedy tokens (CUDA graphs on, chunks of 8 steps, a stop inside a chunk).

Run on a CUDA machine: python -m pytest tests/gpu/test_greedy_multistep.py -q
"""
from __future__ import annotations

import pytest
import torch
from gpu_candidates import PROMPTS, e0_and_candidate, library_candidate, load_module

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate("greedy-multistep-decode", tmp_path_factory.mktemp("candidate") / "engine_dir")


def test_advance_kernel_matches_argmax_under_graph_replays(candidate):
    module = load_module(candidate, "engine/kernels/triton_greedy.py", "candidate_triton_greedy")
    bs, vocab, page, width, steps = 4, 151936, 16, 8, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(bs, vocab, device="cuda", generator=g)
    logits[0, [7, 100_000]] = 30.0       # across chunks
    logits[1, [4096, 4097]] = 30.0       # inside a chunk
    logits[2, vocab - 1] = 30.0          # the last, partial chunk
    page_table = torch.randint(1, 500, (bs, width), device="cuda", generator=g, dtype=torch.int32)
    positions = torch.tensor([0, 15, 16, 40], device="cuda")
    start = positions.clone()
    tokens = torch.zeros(steps, bs, dtype=torch.int64, device="cuda")
    ids, slots = torch.zeros(bs, dtype=torch.int64, device="cuda"), torch.zeros(bs, dtype=torch.int64, device="cuda")
    seq_lens = torch.zeros(bs, dtype=torch.int32, device="cuda")
    counters = torch.zeros(bs, dtype=torch.int32, device="cuda")
    n = bs * -(-vocab // 2048)
    partials = (torch.empty(n, device="cuda"), torch.empty(n, dtype=torch.int32, device="cuda"))

    def step():
        module.greedy_advance(logits, partials, counters, ids, positions, start, tokens, page_table, slots,
                              seq_lens, page)

    step()  # compile outside the capture
    positions.copy_(start)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            step()
    graph.replay()
    torch.cuda.synchronize()
    want = logits.argmax(-1)
    assert want[:3].tolist() == [7, 4096, vocab - 1]
    assert (tokens == want[None]).all() and torch.equal(ids, want)
    nxt = start + steps
    assert torch.equal(positions, nxt) and torch.equal(seq_lens, (nxt + 1).to(torch.int32))
    pages = page_table.long().gather(1, (nxt // page).clamp(max=width - 1)[:, None])[:, 0]
    assert torch.equal(slots, pages * page + nxt % page)
    assert int(counters.abs().sum()) == 0


def test_fp32_engine_keeps_e0_tokens_with_graphs(candidate):
    from seis.engine_host.client import Sampling

    def run(eng):
        greedy = Sampling(max_new_tokens=45, ignore_eos=True)  # 45: the last chunk is partial
        outs = [g["token_ids"] for g in eng.generate(PROMPTS, greedy)]
        stop = outs[0][10]  # a stop id met inside a chunk
        stopped = eng.generate(PROMPTS[:1], Sampling(max_new_tokens=45, stop_token_ids=(stop,)))[0]["token_ids"]
        return outs, stopped, eng.stats().get("greedy_steps_per_sync")  # E0 has no such counter

    e0, cand = e0_and_candidate(candidate, run)
    assert cand[:2] == e0[:2] and cand[2] == 8 and e0[2] is None
