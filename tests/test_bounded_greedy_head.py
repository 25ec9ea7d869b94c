"""The `bounded-greedy-head` and `batched-bounded-greedy-head` library entries on CPU, run by Triton's
interpreter: the token the two launches pick from the int8 head and its bounds is the argmax of the full head's
logits (E0's final add-RMSNorm and F.linear, rounded to the model dtype), with an exact tie (the first index wins),
a hidden size that is not a power of two and rows so alike that every row is a candidate; the row's step inputs
advance as greedy_advance advances them, and the counter and the atomic maximum are back at their start after every
launch, as CUDA graph replays need. The batched entry gives every row of a step its full-head token (1, 3 and 8
rows, ties included) and resets every row's counter and maximum. An fp32 tiny-qwen3 engine on the CPU, with the head
forced on (the engine takes it on CUDA only), keeps the greedy tokens of the same engine without it, one request a
step and three.

The checks run in child processes (tests/interpreted.py). The engine path in CUDA graphs is checked on the GPU:
tests/gpu/test_bounded_greedy_head.py.
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from interpreted import run_interpreted  # noqa: E402
from seis.agents.offline.library import load_library  # noqa: E402
from seis.agents.offline.merge import with_prerequisites  # noqa: E402
from seis.agents.offline.verify import build_candidate  # noqa: E402

CHECK = r'''
import sys

import torch

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.kernels import bounded_head, torch_ops  # the candidate's


def pick(head, hidden, residual):
    """The head's token for one row at position 5 (page size 4), and the row's step inputs after it."""
    ids, pos, start = torch.zeros(1, dtype=torch.int64), torch.tensor([5]), torch.tensor([5])
    tokens, table = torch.zeros((4, 1), dtype=torch.int64), torch.arange(8, dtype=torch.int32)[None] + 10
    slots, seq = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    head(hidden, residual, ids, pos, start, tokens, table, slots, seq, 4)
    assert int(ids) == int(tokens[0, 0]) and int(pos) == 6 and int(seq) == 7 and int(slots) == 11 * 4 + 2
    assert float(head.best) == -float("inf") and int(head.count) == 0  # ready for the next launch
    return int(tokens[0, 0])


def full_head(hidden, residual, nw, weight):
    logits = torch_ops.norm_linear_rows(hidden, residual, torch.zeros(1, dtype=torch.int64), nw, 1e-6, weight)
    return int(logits.float().argmax())


def candidates(head, k):
    """How many rows the second launch computed (the bound recomputed from what the first one stored)."""
    dt, x = head.weight.dtype, head.x[:k].float()
    t = x.abs().max() / 127
    slack = head.bound * x.norm() + head.norm * (x - torch.floor(x / t + 0.5).clamp(-127, 127) * t).norm()
    lower = head.upper - 2 * slack
    return int((head.upper.to(dt).float() >= lower.max().to(dt).float()).sum())


g = torch.Generator().manual_seed(0)
cases, counts = 0, []
for dtype, vocab, k in ((torch.float32, 3000, 64), (torch.bfloat16, 2100, 96)):
    w = (torch.randn(vocab, k, generator=g) * 0.05).to(dtype)
    ties = [1234, *range(1300, 1320), vocab - 5]  # rows equal to row 77: in later blocks of candidates and programs
    w[ties] = w[77].clone()
    nw = (torch.rand(k, generator=g) + 0.5).to(dtype)
    head = bounded_head.BoundedGreedyHead(w, nw, 1e-6)
    inputs = [(torch.randn(1, k, generator=g).to(dtype), torch.randn(1, k, generator=g).to(dtype)) for _ in range(2)]
    inputs.append(((w[77].float() * 40).to(dtype)[None], torch.zeros(1, k, dtype=dtype)))  # the tie on top
    for hidden, residual in inputs:
        want = full_head(hidden, residual, nw, w)
        assert pick(head, hidden, residual) == want, (dtype, vocab, k, want)
        counts.append(candidates(head, k))
        cases += 1
    assert want == 77  # the tie went to the first index
# every row a candidate: rows that differ by far less than their int8 error
w = ((torch.randn(1, 64, generator=g) * 0.05).expand(2500, 64) + torch.randn(2500, 64, generator=g) * 1e-5)
w = w.contiguous()
head = bounded_head.BoundedGreedyHead(w, torch.ones(64), 1e-6)
hidden, residual = torch.randn(1, 64, generator=g), torch.zeros(1, 64)
assert pick(head, hidden, residual) == full_head(hidden, residual, torch.ones(64), w)
assert candidates(head, 64) == 2500
cases += 1
print(f"cases {cases} candidates {max(counts)}")
'''


@pytest.mark.slow
def test_the_bounded_head_picks_the_full_heads_greedy_token(tmp_path):
    library = {t.name: t for t in load_library()}
    t = library["bounded-greedy-head"]
    assert set(t.prerequisites) == {"triton-gemv", "greedy-multistep-decode"}
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    out = run_interpreted(CHECK, candidate, tmp_path, timeout_s=600)
    cases, _, most = out.split()[-3:]
    assert cases == "7" and 22 <= int(most) <= 40  # the 22 tied rows, and a few more of thousands


ENGINE = r"""
import sys

from seis.engine_import import import_engine
from seis.models import resolve_model

engine = import_engine(sys.argv[1])
from engine.kernels import bounded_head

calls = []
original = bounded_head.BoundedGreedyHead.__call__
bounded_head.BoundedGreedyHead.__call__ = lambda self, *a: calls.append(1) or original(self, *a)


ROWS = int(sys.argv[2])  # requests a call: steps of that many rows
PROMPTS = ([5, 17, 33, 100, 7], [9] * 40, [200])


def forced(self, attn):  # what _greedy_head gives on CUDA, here on the CPU (Triton's interpreter runs the kernels)
    rows = {"max_rows": ROWS} if ROWS > 1 else {}
    head = bounded_head.BoundedGreedyHead(self.model.lm_head, self.model.norm, self.config.rms_norm_eps, **rows)
    return {"layers": lambda batch: self.model.layers_forward(batch, attn, self.kv), "head": head}


def tokens(with_head):
    engine.Engine._greedy_head = forced if with_head else (lambda self, attn: {})
    eng = engine.Engine(resolve_model("tiny-qwen3"), engine.EngineOptions(device="cpu", dtype="float32",
                                                                          max_batch_size=4, max_seq_len=512))
    eng.build()
    sampling = engine.SamplingParams(max_new_tokens=12, ignore_eos=True)
    calls = [PROMPTS[i : i + ROWS] for i in range(0, len(PROMPTS), ROWS)]
    return [g.token_ids for call in calls for g in eng.generate(list(call), sampling)]


with_head = tokens(True)
used = len(calls)
assert tokens(False) == with_head and len(calls) == used
print(f"steps {used}")
"""


@pytest.mark.slow
@pytest.mark.parametrize("entry,rows", [("bounded-greedy-head", 1), ("batched-bounded-greedy-head", 3)])
def test_an_engine_with_the_head_keeps_its_greedy_tokens(tmp_path, entry, rows):
    t = next(t for t in load_library() if t.name == entry)
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    out = run_interpreted(ENGINE, candidate, tmp_path, timeout_s=600, args=[str(rows)])
    assert int(out.split()[-1]) >= 3 * 11 // rows  # every greedy step after a prefill took the head


ROWS_CHECK = r"""
import sys

import torch

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.kernels import bounded_head, torch_ops  # the candidate's

g = torch.Generator().manual_seed(0)
for dtype, vocab, k in ((torch.float32, 3000, 64), (torch.bfloat16, 2100, 96)):
    w = (torch.randn(vocab, k, generator=g) * 0.05).to(dtype)
    w[[1234, *range(1300, 1320), vocab - 5]] = w[77].clone()  # ties in later candidate blocks and programs
    nw = (torch.rand(k, generator=g) + 0.5).to(dtype)
    head = bounded_head.BoundedGreedyHead(w, nw, 1e-6, max_rows=8)
    for m in (1, 3, 8):
        hidden, residual = torch.randn(m, k, generator=g).to(dtype), torch.randn(m, k, generator=g).to(dtype)
        hidden[m - 1], residual[m - 1] = (w[77].float() * 40).to(dtype), 0  # the last row's top is the tie
        want = torch_ops.norm_linear_rows(hidden, residual, torch.arange(m), nw, 1e-6, w).float().argmax(-1)
        ids, pos = torch.zeros(m, dtype=torch.int64), torch.arange(m) + 5
        tokens, table = torch.zeros((4, m), dtype=torch.int64), (torch.arange(8, dtype=torch.int32) + 10).repeat(m, 1)
        slots, seq = torch.zeros(m, dtype=torch.int64), torch.zeros(m, dtype=torch.int32)
        head(hidden, residual, ids, pos, pos.clone(), tokens, table, slots, seq, 4)
        assert tokens[0].tolist() == want.tolist() == ids.tolist() and int(want[-1]) == 77, (dtype, m)
        assert torch.equal(pos, torch.arange(m) + 6) and torch.equal(seq, (torch.arange(m) + 7).int())
        assert (head.best == -float("inf")).all() and not head.count.any()  # every row ready for the next launch
        print(dtype, m, "ok")
"""


@pytest.mark.slow
def test_the_batched_head_picks_every_rows_full_head_token(tmp_path):
    t = next(t for t in load_library() if t.name == "batched-bounded-greedy-head")
    assert t.prerequisites == ("bounded-greedy-head",)
    candidate = build_candidate(tmp_path / "candidate", with_prerequisites(t))
    assert run_interpreted(ROWS_CHECK, candidate, tmp_path, timeout_s=600).count("ok") == 6
