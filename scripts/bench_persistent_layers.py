"""The persistent-decode-layers entry's one launch against the launch chain it replaces, at one request:

    python scripts/bench_persistent_layers.py [--context 356] [--warps 8] [--reps 7] [--json F]     (CUDA)

Builds E0 with the ten-entry stack and persistent-decode-layers into a temporary folder, loads qwen3-0.6b-random
(bf16) without the engine's own graphs, and times, each in a CUDA graph of 20 steps, the model's 28 layers of one
decode step as layers_forward runs them (the stack's GEMVs, q/k norm + RoPE + KV write, split-KV attention: six
launches a layer) and as PersistentDecode runs them (one launch). The third row is the same launch with the grid
barrier's atomics taken out of a copy of the kernel: its outputs are wrong (phases race), it is timed only, to
show what the 139 barriers cost. Median (min-max) of --reps replays of 10 graphs, microseconds per step.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STACK = ("triton-gemv,prefill-cuda-graphs,fused-decode-attention,fused-qk-rope-store,greedy-multistep-decode,"
         "gate-up-silu-epilogue,overlapped-greedy-chunks,batched-mlp-matmuls,bounded-greedy-head,"
         "batched-bounded-greedy-head,persistent-decode-layers")
BARRIER_WAIT = '''    tl.atomic_add(SYNC, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(SYNC, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(SYNC, 0, sem="acquire", scope="gpu")
'''

TIMER = r'''
import json
import sys

import torch

from seis.engine_import import import_engine
from seis.models import resolve_model

engine = import_engine(sys.argv[1])
from engine.attention import TritonAttention
from engine.batch import ForwardBatch
from engine.kernels.persistent_decode import PersistentDecode

context, warps, reps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
eng = engine.Engine(resolve_model("qwen3-0.6b-random"), engine.EngineOptions(
    device="cuda", dtype="bfloat16", max_batch_size=4, max_seq_len=2048, use_cuda_graphs=False))
eng.build()
cfg, kv, dev, page = eng.config, eng.kv, eng.device, eng.options.page_size
g = torch.Generator(device=dev).manual_seed(0)
for t in kv.k + kv.v:
    t.copy_(torch.randn(t.shape, generator=g, device=dev))
pos = context - 1
table = (torch.arange(eng.page_table.width, device=dev) + 1).to(torch.int32)[None]
batch = ForwardBatch(is_decode=True, input_ids=torch.tensor([7], device=dev), positions=torch.tensor([pos], device=dev),
                     out_slots=torch.tensor([int(table[0, pos // page]) * page + pos % page], device=dev),
                     seq_lens=torch.tensor([context], dtype=torch.int32, device=dev), page_table=table,
                     logit_rows=torch.tensor([0], device=dev))
attn = TritonAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 4, dev)
step = PersistentDecode(eng.model, kv, page, num_warps=warps)


def graph(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        for _ in range(20):
            fn()
    return captured


def timed(captured):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        captured.replay()
        torch.cuda.synchronize()
        start.record()
        for _ in range(10):
            captured.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / 200)
    times.sort()
    return {"median": times[len(times) // 2], "min": times[0], "max": times[-1]}


out = {"persistent": timed(graph(lambda: step(batch)))}
if sys.argv[5] == "full":
    out["layers_forward"] = timed(graph(lambda: eng.model.layers_forward(batch, attn, kv)))
print(json.dumps(out))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=356, help="tokens in the KV cache, the new one included")
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from seis.agents.offline.library import load_library
    from seis.agents.offline.verify import build_candidate
    from seis.tables import markdown
    library = {t.name: t for t in load_library()}
    with tempfile.TemporaryDirectory() as tmp:
        tree = build_candidate(Path(tmp) / "stack", [library[n] for n in STACK.split(",")])
        unsynced = build_candidate(Path(tmp) / "unsynced", [library[n] for n in STACK.split(",")])
        kernel = unsynced / "engine/kernels/persistent_decode.py"
        source = kernel.read_text()
        assert BARRIER_WAIT in source, "the barrier's code changed: update BARRIER_WAIT"
        kernel.write_text(source.replace(BARRIER_WAIT, ""))
        env_args = [str(args.context), str(args.warps), str(args.reps)]
        rows = {}
        for label, folder, mode in (("", tree, "full"), ("without the barrier's atomics", unsynced, "one")):
            done = subprocess.run([sys.executable, "-c", TIMER, str(folder), *env_args, mode], capture_output=True,
                                  text=True, cwd=REPO, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            if "layers_forward" in result:
                rows["layers_forward: six launches a layer"] = result["layers_forward"]
            rows[f"PersistentDecode: one launch {label}".strip()] = result["persistent"]
    table = [[name, f"{r['median']:.1f} ({r['min']:.1f}-{r['max']:.1f})"] for name, r in rows.items()]
    print(markdown(["28 layers, one request, us a step", f"context {args.context}, {args.warps} warps"], table))
    if args.json:
        args.json.write_text(json.dumps({"context": args.context, "warps": args.warps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
