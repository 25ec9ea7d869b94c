"""batched-mlp-matmuls' Triton matmuls against cuBLAS at Qwen3-0.6B shapes, alone and in a decoder layer's sequence.

    python scripts/bench_mlp_matmuls.py [--m 8,32] [--json F]     (CUDA)

The kernel is the library entry's own (engine/kernels/triton_matmul.py of E0 + the entry and its prerequisites,
built into a temporary folder). Timed inside one CUDA graph over 28 layers' weights (W streamed from memory, as a
decode step reads it), median (min-max) of 7 timings of 10 replays, microseconds per call:
- each use alone: gate-up then E0's SiLU-and-mul kernel against the matmul with the SiLU-and-mul epilogue; O and
  down, F.linear against the matmul;
- a decoder layer without attention: E0's add-RMSNorm, QKV, O, add-RMSNorm, gate-up, SiLU-and-mul, down (cuBLAS),
  against the same with the projections the entry takes (triton_ops' dispatch) on its matmul.
--sweep also times each use alone at every tile (block_n 16/32/64 x block_k 128/256 x 3 or 4 stages x
programmatic dependent launch on or off) and reports the five fastest; the entry's tiles come from such a sweep.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

import torch

from decoder_layers import HIDDEN, INTERMEDIATE, LAYERS, Q_OUT, random_layers
from seis.benchmarks.graph_timing import graph_times
from seis.stats import fmt_range, summarize


def _us(fn) -> dict:
    return summarize(graph_times(fn, LAYERS, repeats=7, replays=10))


def _entry_kernels(dest: Path):
    """triton_matmul and E0's triton_ops as the entry's engine has them, imported from a tree built from the library."""
    from seis.agents.offline.library import load_library
    from seis.agents.offline.merge import with_prerequisites
    from seis.agents.offline.verify import build_candidate
    from seis.engine_import import import_engine

    entry = next(t for t in load_library() if t.name == "batched-mlp-matmuls")
    import_engine(build_candidate(dest, with_prerequisites(entry)))
    from engine.kernels import triton_matmul, triton_ops
    return triton_matmul, triton_ops


def bench(rows: list[int], tmp: Path, sweep: bool) -> dict:
    mm, ops = _entry_kernels(tmp / "engine")
    dev, dt, F = torch.device("cuda"), torch.bfloat16, torch.nn.functional
    torch.manual_seed(0)
    layers = random_layers(dev, dt)
    report = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "layers_per_graph": LAYERS, "rows": []}
    for m in rows:
        x, attn, act = (torch.randn(m, k, device=dev, dtype=dt) for k in (HIDDEN, Q_OUT, INTERMEDIATE))
        # each use: its input, its weight, whether the matmul ends in SiLU-and-mul (cuBLAS + E0's kernel then)
        uses = {"gate-up + SiLU-and-mul": (x, "gate_up", True), "O": (attn, "o", False), "down": (act, "down", False)}

        def cublas(inp, name, silu):
            def call(i):
                y = F.linear(inp, layers[i][name])
                return ops.silu_and_mul(y) if silu else y
            return call

        alone = {use: (_us(cublas(inp, name, silu)), _us(lambda i: mm.matmul(inp, layers[i][name], silu)))
                 for use, (inp, name, silu) in uses.items()}
        tiles = {}
        for use, (inp, name, silu) in uses.items() if sweep else ():
            timed = []
            for block_n, block_k, stages, pdl in itertools.product((16, 32, 64), (128, 256), (3, 4), (True, False)):
                tile = {"block_n": block_n, "block_k": block_k, "stages": stages, "pdl": pdl}
                timed.append({**tile, **_us(lambda i: mm.matmul(inp, layers[i][name], silu, **tile))})
            tiles[use] = sorted(timed, key=lambda t: t["median"])
            for t in tiles[use][:5]:
                print(f"m={m} {use} tile {t['block_n']}x{t['block_k']}, {t['stages']} stages, PDL {t['pdl']}: "
                      f"{fmt_range(t, 2)} us", flush=True)
        state = {}

        def layer(mlp, linear):
            def one(i):
                p = layers[i]
                h, r = (x.clone(), torch.zeros_like(x)) if i == 0 else (state["h"], state["r"])
                hn, r = ops.add_rmsnorm(h, r, p["norm1"], 1e-6)
                F.linear(hn, p["qkv"])
                h = linear(attn, p["o"])
                a, state["r"] = mlp(h, r, p)
                state["h"] = linear(a, p["down"])
            return one

        def e0_mlp(h, r, p):
            hn, r = ops.add_rmsnorm(h, r, p["norm2"], 1e-6)
            return ops.silu_and_mul(F.linear(hn, p["gate_up"])), r

        def entry_mlp(h, r, p):
            return ops.norm_linear_silu_mul(h, r, p["norm2"], 1e-6, p["gate_up"])

        layer_us = {"E0 (cuBLAS, SiLU-and-mul kernel)": _us(layer(e0_mlp, F.linear)),
                    "batched-mlp-matmuls": _us(layer(entry_mlp, ops.linear))}
        row = {"m": m, "alone": {k: {"cublas": a, "entry": b} for k, (a, b) in alone.items()}, "layer": layer_us,
               "tiles": tiles}
        for k, (a, b) in alone.items():
            print(f"m={m} {k}: cuBLAS {fmt_range(a, 2)} us, entry {fmt_range(b, 2)} us", flush=True)
        for k, v in layer_us.items():
            print(f"m={m} layer, {k}: {fmt_range(v, 2)} us", flush=True)
        report["rows"].append(row)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="8,32", help="decode rows (3 to 32: the rows the entry takes)")
    ap.add_argument("--sweep", action="store_true", help="also time every tile of each use alone")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_mlp_matmuls needs a CUDA device")
    with tempfile.TemporaryDirectory() as tmp:
        report = bench([int(v) for v in args.m.split(",")], Path(tmp), args.sweep)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
