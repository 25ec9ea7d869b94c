"""The `persistent-decode-layers` library entry on CPU, run by Triton's interpreter with a grid of one program (the
interpreter runs programs one after another, so a grid barrier of more would never open): the one-launch step's
hidden state, residual and new K/V rows equal the model's layers_forward (torch attention) on tiny-qwen3 (q/k norm,
one-piece intermediate size) and tiny-llama (no q/k norm, a two-piece intermediate size), at the first position
and later ones, with 2 to 8 attention splits, on the CUDA cores and with tl.dot; the barrier and merge counters are
zero again after every launch, as CUDA graph replays need. An fp32 tiny-qwen3 engine with the bounded head and the
persistent step forced on keeps the greedy tokens of the same engine without them.

The checks run in child processes (tests/interpreted.py). Grids of one program per SM, bf16 and CUDA graphs are
checked on the GPU: tests/gpu/test_persistent_decode_layers.py.
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from interpreted import run_interpreted  # noqa: E402
from seis.agents.offline.library import load_library  # noqa: E402
from seis.agents.offline.merge import with_prerequisites  # noqa: E402
from seis.agents.offline.verify import build_candidate  # noqa: E402

KERNEL = r'''
import sys

import torch

from seis.engine_import import import_engine
from seis.models import resolve_model

engine = import_engine(sys.argv[1])
from engine.attention import TorchAttention
from engine.batch import ForwardBatch
from engine.kernels.persistent_decode import PersistentDecode, supported

PAGE = 4
g = torch.Generator().manual_seed(0)
for name in ("tiny-qwen3", "tiny-llama"):
    eng = engine.Engine(resolve_model(name), engine.EngineOptions(device="cpu", dtype="float32", max_batch_size=2,
                                                                  max_seq_len=128, page_size=PAGE,
                                                                  use_cuda_graphs=False))
    eng.build()
    cfg, kv = eng.config, eng.kv
    assert supported(eng.model, torch.float32) is None
    for t in kv.k + kv.v:  # earlier positions' K/V: anything, as long as both paths read the same
        t.copy_(torch.randn(t.shape, generator=g))
    attn = TorchAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    for pos, splits, mma in ((0, 2, False), (6, 2, True), (37, 4, False), (37, 8, True)):
        table = (torch.randperm(30, generator=g)[:12] + 1).to(torch.int32)[None]
        slot = int(table[0, pos // PAGE]) * PAGE + pos % PAGE
        batch = ForwardBatch(is_decode=True, input_ids=torch.tensor([7 + pos]), positions=torch.tensor([pos]),
                             out_slots=torch.tensor([slot]), seq_lens=torch.tensor([pos + 1], dtype=torch.int32),
                             page_table=table, logit_rows=torch.tensor([0]))
        before = [t.clone() for t in kv.k + kv.v]
        want_h, want_r = eng.model.layers_forward(batch, attn, kv)
        want_kv = [t.clone() for t in kv.k + kv.v]
        for t, b in zip(kv.k + kv.v, before):
            t.copy_(b)
        step = PersistentDecode(eng.model, kv, PAGE, splits=splits, mma=mma)
        assert step.programs == 1
        h, r = step(batch)
        err = max((h - want_h).abs().max().item(), (r - want_r).abs().max().item())
        err_kv = max((t - w).abs().max().item() for t, w in zip(kv.k + kv.v, want_kv))
        assert err < 1e-4 and err_kv < 1e-5, (name, pos, splits, mma, err, err_kv)
        assert not step.sync.any() and not step.counters.any(), (step.sync, step.counters)
        print(name, pos, splits, mma, "ok", flush=True)
'''


def _candidate(tmp_path):
    t = next(t for t in load_library() if t.name == "persistent-decode-layers")
    assert set(t.prerequisites) == {"batched-bounded-greedy-head", "fused-decode-attention"}
    return build_candidate(tmp_path / "candidate", with_prerequisites(t))


@pytest.mark.slow
def test_the_one_launch_step_computes_the_models_layers(tmp_path):
    out = run_interpreted(KERNEL, _candidate(tmp_path), tmp_path, timeout_s=600)
    assert out.count(" ok") == 8


ENGINE = r"""
import sys

from seis.engine_import import import_engine
from seis.models import resolve_model

engine = import_engine(sys.argv[1])
from engine.kernels import bounded_head, persistent_decode

calls = []
original = persistent_decode.PersistentDecode.__call__
persistent_decode.PersistentDecode.__call__ = lambda self, batch: calls.append(1) or original(self, batch)
PROMPTS = ([5, 17, 33, 100, 7], [9] * 40, [200])


def forced(self, attn):
    # what _greedy_head gives on CUDA, here on the CPU (Triton's interpreter runs the kernels), persistent or not
    head = bounded_head.BoundedGreedyHead(self.model.lm_head, self.model.norm, self.config.rms_norm_eps)
    layers = lambda batch: self.model.layers_forward(batch, attn, self.kv)
    step = self._persistent_step() if PERSISTENT else None
    assert (step is not None) == PERSISTENT
    return {"layers": (lambda batch: step(batch) if batch.batch_size == 1 else layers(batch)) if step else layers,
            "head": head}


def tokens():
    engine.Engine._greedy_head = forced
    eng = engine.Engine(resolve_model("tiny-qwen3"), engine.EngineOptions(device="cpu", dtype="float32",
                                                                          max_batch_size=4, max_seq_len=512))
    eng.build()
    sampling = engine.SamplingParams(max_new_tokens=12, ignore_eos=True)
    return [g.token_ids for p in PROMPTS for g in eng.generate([p], sampling)]


PERSISTENT = True
with_step = tokens()
PERSISTENT = False
assert tokens() == with_step
print(f"steps {len(calls)}")
"""


@pytest.mark.slow
def test_an_engine_with_the_persistent_step_keeps_its_greedy_tokens(tmp_path):
    out = run_interpreted(ENGINE, _candidate(tmp_path), tmp_path, timeout_s=600)
    assert int(out.split()[-1]) >= 3 * 11  # every greedy step after a prefill took the persistent launch
