"""GPU checks of the `bounded-greedy-head` library entry. Compiled, at Qwen3-0.6B's head (151,936 x 1,024, bf16):
the token of the int8 pass and its candidates is the argmax of triton-gemv's full-head logits, launched directly
and replayed from a CUDA graph. In an engine (CUDA graphs on): one-row greedy steps take the bounded head, and the
tokens equal those of the same engine without it, fp32 and bf16 tiny-qwen3 and bf16 qwen3-0.6b-random.

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
from engine.kernels import bounded_head, triton_gemv

g = torch.Generator(device="cuda").manual_seed(0)
vocab, k = 151936, 1024
w = (torch.randn(vocab, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
nw = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
head = bounded_head.BoundedGreedyHead(w, nw, 1e-6)
hidden = torch.empty(1, k, device="cuda", dtype=torch.bfloat16)
residual = torch.empty_like(hidden)
ids, pos, start = (torch.zeros(1, dtype=torch.int64, device="cuda") for _ in range(3))
tokens = torch.zeros((1, 1), dtype=torch.int64, device="cuda")
table = torch.zeros((1, 4), dtype=torch.int32, device="cuda")
slots, seq = torch.zeros(1, dtype=torch.int64, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
step = lambda: head(hidden, residual, ids, pos, start, tokens, table, slots, seq, 16)
step()  # compile outside the capture
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    step()
counts = []
for trial in range(100):
    hidden.copy_(torch.randn(1, k, device="cuda", generator=g))
    residual.copy_(torch.randn(1, k, device="cuda", generator=g))
    logits = triton_gemv.norm_gemv(hidden, residual, nw, 1e-6, w, rows=torch.zeros(1, dtype=torch.int64,
                                                                                     device="cuda"))[0]
    want = int(logits.float().argmax())
    for launch in (step, graph.replay):
        pos.zero_(); start.zero_()
        launch()
        assert int(tokens[0, 0]) == want == int(ids[0]) and int(pos[0]) == 1, (trial, want, int(tokens[0, 0]))
    dt, x = torch.bfloat16, head.x[:k].float()
    t = x.abs().max() / 127
    slack = head.bound * x.norm() + head.norm * (x - torch.floor(x / t + 0.5).clamp(-127, 127) * t).norm()
    lower = head.upper - 2 * slack
    counts.append(int((head.upper.to(dt).float() >= lower.max().to(dt).float()).sum()))
counts.sort()
print(f"trials 100 candidates median {counts[50]} max {counts[-1]}")
'''

ENGINE = r'''
import json
import sys

from seis.engine_import import import_engine
from seis.models import resolve_model

engine = import_engine(sys.argv[1])
from engine.kernels import bounded_head

model, dtype = sys.argv[2], sys.argv[3]
prompts = json.loads(sys.argv[4])
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
    return [eng.generate([p], sampling)[0].token_ids for p in prompts]  # one request a call: one-row steps


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


@pytest.fixture(scope="module")
def candidate(tmp_path_factory):
    return library_candidate("bounded-greedy-head", tmp_path_factory.mktemp("candidate") / "engine_dir")


def test_the_head_picks_triton_gemvs_argmax_at_qwen3_shape(candidate):
    assert "trials 100" in _child(KERNEL, str(candidate))


@pytest.mark.parametrize("model,dtype", [("tiny-qwen3", "float32"), ("tiny-qwen3", "bfloat16"),
                                         ("qwen3-0.6b-random", "bfloat16")])
def test_an_engine_with_the_head_keeps_its_greedy_tokens(candidate, model, dtype):
    import json
    assert "calls" in _child(ENGINE, str(candidate), model, dtype, json.dumps(PROMPTS))
