"""Time decode attention of E0's Triton backend against the offline library's attention transformations at
Qwen3-0.6B shapes (16 query heads, 8 KV heads, head dim 128, pages of 16).

    python scripts/bench_attention.py [--lens 128,356,1024,2048,4096] [--bs 1,4,16] [--sweep]

Each engine variant (E0, E0 + splitkv-by-batch-size, E0 + fused-decode-attention) runs in its own process
through its own TritonAttention.decode: one CUDA graph holds 28 layers' decode attention (28 KV caches, as a
forward step reads them) replayed 5 times; the time is the median per layer call, in microseconds. Every variant's
output is compared with E0's torch (SDPA) path first. --sweep also times block_n x num_warps x splits (x mma,
tensor cores or not, where the kernel offers both) for the transformations whose paged_decode takes them, and
reports every tile's time, the best tile and the best on tensor cores. Prints one JSON object. Needs CUDA.
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from seis.benchmarks.graph_timing import graph_us

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("E0", "splitkv-by-batch-size", "fused-decode-attention")
HEADS, KV_HEADS, HEAD_DIM, PAGE, LAYERS, REPEATS = 16, 8, 128, 16, 28, 5


def _with_tile(kernel, tile: dict):
    """kernel, launched with `tile` in place of the tile its caller passes (the engine passes its own)."""
    return lambda *args, **kwargs: kernel(*args, **{**kwargs, **tile})


def run_variant(engine_dir: Path, lens: list[int], batch_sizes: list[int], sweep: bool) -> dict:
    """In this process: time engine_dir's TritonAttention.decode for every (batch size, context length)."""
    import torch
    sys.path.insert(0, str(REPO))
    from seis.engine_import import import_engine
    import_engine(engine_dir)
    from engine.attention import TorchAttention, TritonAttention
    from engine.batch import ForwardBatch
    from engine.kernels import triton_attention
    from engine.kv_cache import KVCache

    dev, dtype = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    max_bs, max_len = max(batch_sizes), max(lens)
    width = -(-max_len // PAGE)
    kv = KVCache(LAYERS, max_bs * width + 1, PAGE, KV_HEADS, HEAD_DIM, dtype, dev)
    for t in kv.k + kv.v:
        t.normal_(generator=g)
    # Request i owns pages 1 + i*width ... in a shuffled order, as an allocator that has run a while would hand out.
    perm = torch.randperm(max_bs * width, generator=g, device=dev).to(torch.int32) + 1
    page_table = perm.view(max_bs, width)
    ref = TorchAttention(HEADS, KV_HEADS, HEAD_DIM)
    original = triton_attention.paged_decode
    tile_args = "block_n" in original.__code__.co_varnames
    results = {}
    for bs in batch_sizes:
        q = torch.randn(bs, HEADS * HEAD_DIM, generator=g, device=dev).to(dtype)
        for length in lens:
            seq = torch.full((bs,), length, dtype=torch.int32, device=dev)
            batch = ForwardBatch(is_decode=True, input_ids=torch.zeros(bs, dtype=torch.int64, device=dev),
                                 positions=seq.long() - 1, out_slots=torch.zeros(bs, dtype=torch.int64, device=dev),
                                 seq_lens=seq, page_table=page_table[:bs], logit_rows=torch.arange(bs, device=dev),
                                 cuda_graph=True)
            attn = TritonAttention(HEADS, KV_HEADS, HEAD_DIM, max_bs, dev)
            qh = q.view(bs, HEADS, HEAD_DIM)
            want = ref.decode(0, qh, batch, kv).float()
            err = (attn.decode(0, qh, batch, kv).float() - want).abs().max().item()
            entry = {"us": round(graph_us(lambda layer: attn.decode(layer, qh, batch, kv), LAYERS, REPEATS), 2),
                     "max_abs_err_vs_sdpa": round(err, 5)}
            if sweep and tile_args:
                # The number of splits itself, not only its cap: the rule's choice at a large batch (2 at 32
                # requests) sits below every cap, so sweeping max_splits would time one point.
                has_mma = "mma" in original.__code__.co_varnames  # tensor cores (fused-decode-attention's variant)
                timed = []
                for block_n, warps, splits, mma in itertools.product(
                        (16, 32, 64), (2, 4, 8), [s for s in (2, 4, 8, 16, 32) if s <= attn.max_splits],
                        (False, True) if has_mma else (False,)):
                    tile = {"block_n": block_n, "num_warps": warps, **({"mma": mma} if has_mma else {})}
                    triton_attention.paged_decode = _with_tile(original, tile)
                    attn.num_splits = lambda _bs, splits=splits: splits
                    err = (attn.decode(0, qh, batch, kv).float() - want).abs().max().item()
                    us = graph_us(lambda layer: attn.decode(layer, qh, batch, kv), LAYERS, REPEATS)
                    timed.append({"us": round(us, 2), "block_n": block_n, "num_warps": warps, "splits": splits,
                                  "mma": mma, "max_abs_err_vs_sdpa": round(err, 5)})
                triton_attention.paged_decode = original
                del attn.num_splits  # the class's rule again
                entry["rule_splits"] = attn.num_splits(bs)
                entry["best"] = min(timed, key=lambda t: t["us"])
                entry["timed"] = timed
                if has_mma:
                    entry["best_mma"] = min((t for t in timed if t["mma"]), key=lambda t: t["us"])
            results[f"bs={bs} len={length}"] = entry
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lens", default="128,356,1024,2048,4096")
    ap.add_argument("--bs", default="1,4,16")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--variant-dir", type=Path, help=argparse.SUPPRESS)  # the child process's engine
    args = ap.parse_args()
    lens, batch_sizes = [int(v) for v in args.lens.split(",")], [int(v) for v in args.bs.split(",")]
    if args.variant_dir:
        print(json.dumps(run_variant(args.variant_dir, lens, batch_sizes, args.sweep)))
        return
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_attention needs a CUDA device")
    sys.path.insert(0, str(REPO))
    from seis.agents.offline.library import load_library
    from seis.agents.offline.verify import build_candidate
    library = {t.name: t for t in load_library()}
    report = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "layers_per_graph": LAYERS,
              "median_of": REPEATS, "variants": {}}
    with tempfile.TemporaryDirectory(prefix="seis-bench-attn-") as tmp:
        for name in VARIANTS:
            engine_dir = build_candidate(Path(tmp) / name, [] if name == "E0" else [library[name]])
            cmd = [sys.executable, __file__, "--variant-dir", str(engine_dir), "--lens", args.lens, "--bs", args.bs]
            done = subprocess.run(cmd + (["--sweep"] if args.sweep else []), capture_output=True, text=True)
            if done.returncode != 0:
                report["variants"][name] = {"error": done.stderr[-2000:]}
                continue
            report["variants"][name] = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
