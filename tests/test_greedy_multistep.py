"""The `greedy-multistep-decode` library entry's argmax-and-advance kernel on CPU, run by Triton's interpreter:
each row's token is torch.argmax's (first index among ties, also across chunks), it is recorded at its step, and
the next step's token, position, KV slot and length are those the torch path computes; its counters end at zero.
The check runs in a child process (tests/interpreted.py).
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from interpreted import run_interpreted  # noqa: E402
from seis.agents.offline.library import load_library  # noqa: E402
from seis.agents.offline.verify import build_candidate  # noqa: E402

CHECK = r'''
import sys

import torch

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.kernels.triton_greedy import greedy_advance

g = torch.Generator().manual_seed(0)
bs, vocab, block, page, width, steps = 3, 1000, 128, 4, 6, 8
logits = torch.randn(bs, vocab, generator=g)
logits[0, [5, 700]] = 9.0      # a tie across chunks: the first index wins
logits[1, [300, 301]] = 9.0    # a tie inside a chunk
logits[2, vocab - 1] = 9.0     # in the last, partial chunk
page_table = torch.randint(1, 50, (bs, width), generator=g, dtype=torch.int32)
positions = torch.tensor([0, 6, 22])  # row 2's next position (23) is the table's last; 24 would pass it
start = torch.tensor([0, 3, 20])
tokens = torch.zeros(steps, bs, dtype=torch.int64)
input_ids, slots = torch.zeros(bs, dtype=torch.int64), torch.zeros(bs, dtype=torch.int64)
seq_lens = torch.zeros(bs, dtype=torch.int32)
counters = torch.zeros(bs, dtype=torch.int32)
chunks = -(-vocab // block)
partials = (torch.empty(bs * chunks), torch.empty(bs * chunks, dtype=torch.int32))
want = logits.argmax(-1)
assert want.tolist() == [5, 300, vocab - 1]
pos0 = positions.clone()
greedy_advance(logits, partials, counters, input_ids, positions, start, tokens, page_table, slots, seq_lens, page,
               block=block)
assert input_ids.tolist() == want.tolist()
assert [tokens[p - s, b].item() for b, (p, s) in enumerate(zip(pos0.tolist(), start.tolist()))] == want.tolist()
assert tokens.count_nonzero().item() == 3  # nothing else written
nxt = pos0 + 1
assert positions.tolist() == nxt.tolist() and seq_lens.tolist() == (nxt + 1).tolist()
pages = page_table.long().gather(1, (nxt // page).clamp(max=width - 1)[:, None])[:, 0]
assert slots.tolist() == (pages * page + nxt % page).tolist()
assert counters.abs().sum().item() == 0
print("advanced")
'''


def test_argmax_and_advance_kernel_matches_torch(tmp_path):
    t = next(t for t in load_library() if t.name == "greedy-multistep-decode")
    candidate = build_candidate(tmp_path / "candidate", [t])
    assert "advanced" in run_interpreted(CHECK, candidate, tmp_path)
