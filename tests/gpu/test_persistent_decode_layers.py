"""GPU checks of the `persistent-decode-layers` library entry. Compiled, with one program per SM and the grid barrier
live: the one-launch step's hidden state, residual and new K/V rows agree with the model's layers_forward (the
Triton decode attention) on fp32 tiny-qwen3 (to float32 rounding) and on bf16 qwen3-0.6b-random (to bf16 rounding
carried through 28 layers), at positions from 0 to 1,023; a replay from a CUDA graph gives the launch's own result
bit for bit, and the barrier and merge counters are zero after each. In an fp32 tiny-qwen3 engine (CUDA graphs on)
the one-request greedy steps take the persistent launch and the tokens equal those of the same engine without it.

Each check runs in a child process: a process may host one `engine` package, the candidate's.

Run on a CUDA machine: python -m pytest tests/gpu/test_persistent_decode_layers.py -q -s
"""
from __future__ import annotations

import json
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
from seis.models import resolve_model

engine = import_engine(sys.argv[1])
from engine.attention import TritonAttention
from engine.batch import ForwardBatch
from engine.kernels.persistent_decode import PersistentDecode

model, dtype, tol = sys.argv[2], sys.argv[3], float(sys.argv[4])
eng = engine.Engine(resolve_model(model), engine.EngineOptions(device="cuda", dtype=dtype, max_batch_size=4,
                                                               max_seq_len=2048, use_cuda_graphs=False))
eng.build()
cfg, kv, dev = eng.config, eng.kv, eng.device
g = torch.Generator(device=dev).manual_seed(0)
for t in kv.k + kv.v:
    t.copy_(torch.randn(t.shape, generator=g, device=dev))
attn = TritonAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 4, dev)
step = PersistentDecode(eng.model, kv, eng.options.page_size)
assert step.programs == torch.cuda.get_device_properties(dev).multi_processor_count
width, page = eng.page_table.width, eng.options.page_size
worst = 0.0
for pos in (0, 99, 355, 1023):
    table = (torch.randperm(width * 3, device=dev, generator=g)[:width] + 1).to(torch.int32)[None]
    slot = int(table[0, pos // page]) * page + pos % page
    batch = ForwardBatch(is_decode=True, input_ids=torch.tensor([(7 + pos) % 100], device=dev),
                         positions=torch.tensor([pos], device=dev), out_slots=torch.tensor([slot], device=dev),
                         seq_lens=torch.tensor([pos + 1], dtype=torch.int32, device=dev), page_table=table,
                         logit_rows=torch.tensor([0], device=dev))
    want_h, want_r = (t.float().clone() for t in eng.model.layers_forward(batch, attn, kv))
    want_kv = [t[slot].float().clone() for t in kv.k + kv.v]
    for t in kv.k + kv.v:
        t[slot] = 0
    h, r = (t.float().clone() for t in step(batch))
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
    errs = [rel(h, want_h), rel(r, want_r)] + [rel(t[slot].float(), w) for t, w in zip(kv.k + kv.v, want_kv)]
    assert max(errs) < tol, (pos, errs)
    worst = max(worst, *errs)
    assert not step.sync.any() and not step.counters.any()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(batch)
    step.hidden.zero_()
    graph.replay()
    assert torch.equal(step.hidden.float(), h[0]) and torch.equal(step.res_a.float(), r[0]), pos
    assert not step.sync.any() and not step.counters.any()
print(f"positions 4 worst {worst:.2e}")
'''

ENGINE = r'''
import json
import sys

from seis.engine_import import import_engine
from seis.models import resolve_model

engine = import_engine(sys.argv[1])
from engine.kernels import persistent_decode

prompts = json.loads(sys.argv[2])
calls = []
original = persistent_decode.PersistentDecode.__call__
persistent_decode.PersistentDecode.__call__ = lambda self, batch: calls.append(1) or original(self, batch)


def tokens(persistent):
    if not persistent:
        engine.Engine._persistent_step = lambda self: None
    eng = engine.Engine(resolve_model("tiny-qwen3"), engine.EngineOptions(device="cuda", dtype="float32",
                                                                          max_batch_size=4, max_seq_len=512))
    eng.build()
    sampling = engine.SamplingParams(max_new_tokens=40, ignore_eos=True)
    return [g.token_ids for p in prompts for g in eng.generate([p], sampling)]


with_step = tokens(True)
used = len(calls)
assert used > 0, "the persistent step never ran"
assert tokens(False) == with_step and len(calls) == used
print(f"calls {used} tokens {sum(map(len, with_step))}")
'''


def _child(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    print(done.stdout.strip())
    return done.stdout


@pytest.fixture(scope="module")
def candidate(tmp_path_factory) -> Path:
    return library_candidate("persistent-decode-layers", tmp_path_factory.mktemp("candidate") / "engine_dir")


@pytest.mark.parametrize("model,dtype,tol", [("tiny-qwen3", "float32", 1e-5), ("qwen3-0.6b-random", "bfloat16", 0.05)])
def test_the_one_launch_step_computes_the_models_layers(candidate, model, dtype, tol):
    assert "positions 4" in _child(KERNEL, str(candidate), model, dtype, str(tol))


def test_an_engine_with_the_persistent_step_keeps_its_greedy_tokens(candidate):
    assert "calls" in _child(ENGINE, str(candidate), json.dumps(PROMPTS))
