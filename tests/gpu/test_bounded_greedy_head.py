"""GPU checks of the `bounded-greedy-head` and `batched-bounded-greedy-head` library entries. Compiled, at
Qwen3-0.6B's head (151,936 x 1,024, bf16): each row's token of the int8 pass and its candidates is the argmax of the
engine's full-head logits (1, 8 and 32 rows), launched directly and replayed from a CUDA graph. In an engine (CUDA
graphs on): greedy steps take the bounded head, and the tokens equal those of the same engine without it.

Each check runs in a child process: a process may host one `engine` package, the candidate's.

Run on a CUDA machine: python -m pytest tests/gpu/test_bounded_greedy_head.py -q -s
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gpu_candidates import PROMPTS, library_candidate  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

KERNEL = r'''
import sys

import torch

from seis.engine_import import import_engine

import_engine(sys.argv[1])
from engine.kernels import bounded_head, triton_ops

rows = int(sys.argv[2])
g = torch.Generator(device="cuda").manual_seed(0)
vocab, k = 151936, 1024
w = (torch.randn(vocab, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
nw = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
head = bounded_head.BoundedGreedyHead(w, nw, 1e-6, **({"max_rows": rows} if rows > 1 else {}))
hidden = torch.empty(rows, k, device="cuda", dtype=torch.bfloat16)
residual = torch.empty_like(hidden)
ids, pos, start = (torch.zeros(rows, dtype=torch.int64, device="cuda") for _ in range(3))
tokens = torch.zeros((1, rows), dtype=torch.int64, device="cuda")
table = torch.zeros((rows, 4), dtype=torch.int32, device="cuda")
slots, seq = torch.zeros(rows, dtype=torch.int64, device="cuda"), torch.zeros(rows, dtype=torch.int32, device="cuda")
step = lambda: head(hidden, residual, ids, pos, start, tokens, table, slots, seq, 16)
step()  # compile outside the capture
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    step()
for trial in range(100 // rows + 2):
    hidden.copy_(torch.randn(rows, k, device="cuda", generator=g))
    residual.copy_(torch.randn(rows, k, device="cuda", generator=g))
    # the engine's head: triton-gemv's GEMV for one row, E0's add-RMSNorm and cuBLAS for more
    logits = triton_ops.norm_linear_rows(hidden.clone(), residual.clone(), torch.arange(rows, device="cuda"), nw,
                                         1e-6, w)
    want = logits.float().argmax(-1).tolist()
    for launch in (step, graph.replay):
        pos.zero_(); start.zero_()
        launch()
        assert tokens[0].tolist() == want == ids.tolist() and not pos.ne(1).any(), (trial, want, tokens[0])
print(f"rows {rows} trials {100 // rows + 2}")
'''

ENGINE = r'''
import json
import sys

from seis.engine_import import import_engine
from seis.models import resolve_model

engine = import_engine(sys.argv[1])
from engine.kernels import bounded_head

model, dtype = sys.argv[2], sys.argv[3]
prompts, rows = json.loads(sys.argv[4]), int(sys.argv[5])
calls = []
original = bounded_head.BoundedGreedyHead.__call__
bounded_head.BoundedGreedyHead.__call__ = lambda self, *a: calls.append(1) or original(self, *a)


def tokens(with_head):
    if not with_head:
        engine.Engine._greedy_head = lambda self, attn: {}
    eng = engine.Engine(resolve_model(model), engine.EngineOptions(device="cuda", dtype=dtype, max_batch_size=4,
                                                                   max_seq_len=512))
    eng.build()
    sampling = engine.SamplingParams(max_new_tokens=40, ignore_eos=True)
    calls = [prompts[i : i + rows] for i in range(0, len(prompts), rows)]  # steps of `rows` rows
    return [g.token_ids for call in calls for g in eng.generate(list(call), sampling)]


with_head = tokens(True)
used = len(calls)
assert used > 0, "the bounded head never ran"
assert tokens(False) == with_head and len(calls) == used
print(f"calls {used} tokens {sum(map(len, with_head))}")
'''


def _child(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    print(done.stdout.strip())
    return done.stdout


def _candidate(entry: str, tmp_path_factory) -> Path:
    return library_candidate(entry, tmp_path_factory.mktemp("candidate") / "engine_dir")


@pytest.mark.parametrize("entry,rows", [("bounded-greedy-head", 1), ("batched-bounded-greedy-head", 1),
                                        ("batched-bounded-greedy-head", 8), ("batched-bounded-greedy-head", 32)])
def test_the_head_picks_the_full_heads_argmax_at_qwen3_shape(tmp_path_factory, entry, rows):
    assert f"rows {rows}" in _child(KERNEL, str(_candidate(entry, tmp_path_factory)), str(rows))


@pytest.mark.parametrize("entry,model,dtype,rows", [
    ("bounded-greedy-head", "tiny-qwen3", "float32", 1), ("bounded-greedy-head", "tiny-qwen3", "bfloat16", 1),
    ("bounded-greedy-head", "qwen3-0.6b-random", "bfloat16", 1),
    ("batched-bounded-greedy-head", "tiny-qwen3", "float32", 4),
    ("batched-bounded-greedy-head", "qwen3-0.6b-random", "bfloat16", 4)])
def test_an_engine_with_the_head_keeps_its_greedy_tokens(tmp_path_factory, entry, model, dtype, rows):
    import json
    candidate = _candidate(entry, tmp_path_factory)
    assert "calls" in _child(ENGINE, str(candidate), model, dtype, json.dumps(PROMPTS), str(rows))
