"""Time the triton-gemv library transformation's fused GEMVs against E0's unfused sequence at Qwen3-0.6B shapes.

    python scripts/bench_gemv.py [--m 1,2,4,8] [--dtype bfloat16] [--sweep | --chain]

Each variant runs as 200 back-to-back calls inside one CUDA graph (launch overhead as the engine sees it under
graphs), cycling through enough copies of W to pass 256 MB, so W streams from memory as the engine's 28 layers
do and not from L2; the time is the median of 5 replays, per call. Prints one JSON object: per shape and M,
microseconds per call and the GB/s that W (plus activations) would need, for the fused kernel (default tiles) and
for E0's F.linear + separate norm / activation kernels. --sweep also times BLOCK_N x BLOCK_K x num_warps
combinations and reports the best, to retune triton_gemv.tiles() on a new GPU (kernels compiled first in --jobs
processes). "layer m=M" times one decoder layer's four fused projections back to back, with and without
programmatic dependent launch. --chain times that layer as the engine with gate-up-silu-epilogue runs it (QKV with
add-RMSNorm, O, gate-up with the SiLU epilogue, plain down) under tiles() and under a grid of one-token tiles for
O, gate-up and down: the tile a GEMV is fastest with alone is not always the one that lets its neighbours overlap
it. Needs CUDA; builds E0 + triton-gemv (+ gate-up-silu-epilogue for --chain) in a temp dir.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import functools
import itertools
import multiprocessing
import json
import sys
import tempfile
from pathlib import Path

import torch

from seis.benchmarks.graph_timing import graph_us

REPO = Path(__file__).resolve().parent.parent
CALLS, REPEATS = 200, 5
HIDDEN, Q, QKV, INTER, VOCAB = 1024, 2048, 4096, 3072, 151936  # Qwen3-0.6B
EPS = 1e-6
ROTATE_BYTES = 256 << 20  # W copies cycled per graph: well past the H200's 50 MB L2
# (N, K) of a decoder layer's projections (gate_up: gate and up stacked), and with the LM head
LAYER_SHAPES = {"qkv": (QKV, HIDDEN), "o_proj": (HIDDEN, Q), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
SHAPES = {**LAYER_SHAPES, "lm_head": (VOCAB, HIDDEN)}


def _time_us(fn) -> float:
    return graph_us(fn, CALLS, REPEATS)


def _shapes(m: int, dtype: torch.dtype, ops, gemv):
    """name -> (bytes moved, fused(i, **tile), unfused(i), K, N) for the five projections of a layer + the LM
    head; call i uses copy i % copies of W."""
    import torch.nn.functional as F
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.05).to(dtype)

    x, r, a, gu = rnd(m, HIDDEN), rnd(m, HIDDEN), rnd(m, Q), rnd(m, 2 * INTER)
    nw = rnd(HIDDEN) + 1
    size = torch.finfo(dtype).bits // 8
    w = {name: [rnd(n, k) for _ in range(max(1, -(-ROTATE_BYTES // (n * k * size))))]
         for name, (n, k) in SHAPES.items()}
    rows = torch.arange(m, device="cuda")

    def W(name, i):
        return w[name][i % len(w[name])]

    def moved(name, k_in):
        n, k = SHAPES[name]
        return (n * k + m * (k_in + n)) * size

    return {
        # E0's add_rmsnorm is in place: the unfused variants run on copies made once (values drift; timing doesn't).
        "qkv": (moved("qkv", 2 * HIDDEN), lambda i, **t: gemv.norm_gemv(x, r, nw, EPS, W("qkv", i), **t),
                lambda i, xs=x.clone(), rs=r.clone(): F.linear(ops.add_rmsnorm(xs, rs, nw, EPS)[0], W("qkv", i)),
                HIDDEN, QKV),
        "o_proj": (moved("o_proj", Q), lambda i, **t: gemv.gemv(a, W("o_proj", i), **t),
                   lambda i: F.linear(a, W("o_proj", i)), Q, HIDDEN),
        "gate_up": (moved("gate_up", 2 * HIDDEN), lambda i, **t: gemv.norm_gemv(x, r, nw, EPS, W("gate_up", i), **t),
                    lambda i, xs=x.clone(), rs=r.clone(): F.linear(ops.add_rmsnorm(xs, rs, nw, EPS)[0],
                                                                   W("gate_up", i)),
                    HIDDEN, 2 * INTER),
        "down": (moved("down", 2 * INTER), lambda i, **t: gemv.silu_mul_gemv(gu, W("down", i), **t),
                 lambda i: F.linear(ops.silu_and_mul(gu), W("down", i)), INTER, HIDDEN),
        "lm_head": (moved("lm_head", 2 * HIDDEN),
                    lambda i, **t: gemv.norm_gemv(x, r, nw, EPS, W("lm_head", i), rows=rows, **t),
                    lambda i, xs=x.clone(), rs=r.clone(): F.linear(
                        ops.add_rmsnorm(xs, rs, nw, EPS)[0].index_select(0, rows), W("lm_head", i)),
                    HIDDEN, VOCAB),
    }


def _configs(m: int, k: int) -> list[tuple[int, int, int]]:
    """(block_n, block_k, num_warps) worth timing: at most 128 accumulators and at least 8 W elements (16 bytes
    of bf16) a thread, no wider than the row."""
    import triton
    out = []
    for block_n, block_k, warps in itertools.product((1, 2, 4, 8, 16, 32, 64), (128, 256, 512, 1024, 2048, 4096),
                                                     (1, 2, 4, 8)):
        tile = triton.next_power_of_2(m) * block_n * block_k
        if tile <= 4096 * warps and block_k <= triton.next_power_of_2(k) and block_n * block_k >= 256 * warps:
            out.append((block_n, block_k, warps))
    return out


def _engine(engine_dir: Path):
    from seis.engine_import import import_engine
    import_engine(engine_dir)
    from engine.kernels import Ops, triton_gemv, triton_ops
    return Ops("triton", triton_ops), triton_gemv


def _compile(engine_dir: str, m: int, dtype: str, name: str, configs: list) -> int:
    """In a worker process: launch each tile config once, so Triton's on-disk cache holds its kernel."""
    sys.path.insert(0, str(REPO))
    ops, gemv = _engine(Path(engine_dir))
    fused = _shapes(m, getattr(torch, dtype), ops, gemv)[name][1]
    for block_n, block_k, warps in configs:
        fused(0, block_n=block_n, block_k=block_k, num_warps=warps)
    torch.cuda.synchronize()
    return len(configs)


def _precompile(engine_dir: Path, ms: list[int], dtype: str, jobs: int) -> None:
    work = []
    for m in ms:
        for name, (n, k) in SHAPES.items():
            configs = _configs(m, k)
            work += [(str(engine_dir), m, dtype, name, configs[i::4]) for i in range(4)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        list(pool.map(_compile, *zip(*work)))


def _sweep(fused, m: int, n: int, k: int) -> dict:
    best = None
    for block_n, block_k, warps in _configs(m, k):
        us = _time_us(lambda i: fused(i, block_n=block_n, block_k=block_k, num_warps=warps))
        if best is None or us < best["us"]:
            best = {"us": round(us, 2), "block_n": block_n, "block_k": block_k, "num_warps": warps,
                    "programs": -(-n // block_n)}
    return best


# One-token (block_n, num_warps) per GEMV that --chain tries; gate-up's block_n counts gate/up row pairs.
CHAIN_TILES = {"o_proj": ((2, 4), (4, 4), (4, 8)), "gate_up": ((2, 4), (4, 4), (8, 4), (8, 8)),
               "down": ((2, 8), (4, 8), (4, 16), (8, 16))}


def _chain(dtype: torch.dtype) -> dict:
    """A decoder layer's four one-token GEMVs back to back, as the engine runs them, per tile set: µs per layer."""
    from seis.agents.offline.library import load_library
    from seis.agents.offline.merge import with_prerequisites
    from seis.agents.offline.verify import build_candidate
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.05).to(dtype)

    with tempfile.TemporaryDirectory(prefix="seis-bench-chain-") as tmp:
        entry = {t.name: t for t in load_library()}["gate-up-silu-epilogue"]
        _, gemv = _engine(build_candidate(Path(tmp) / "engine", with_prerequisites(entry)))
        x, r, a, act, nw = rnd(1, HIDDEN), rnd(1, HIDDEN), rnd(1, Q), rnd(1, INTER), rnd(HIDDEN) + 1
        size = torch.finfo(dtype).bits // 8
        copies = -(-ROTATE_BYTES // (sum(n * k for n, k in LAYER_SHAPES.values()) * size))
        w = [{name: rnd(n, k) for name, (n, k) in LAYER_SHAPES.items()} for _ in range(copies)]

        def layer(tile):
            def run(i):
                wi = w[i % copies]
                gemv.norm_gemv(x, r, nw, EPS, wi["qkv"])
                gemv.gemv(a, wi["o_proj"], **tile.get("o_proj", {}))
                gemv.norm_gemv_silu_mul(x, r, nw, EPS, wi["gate_up"], **tile.get("gate_up", {}))
                gemv.gemv(act, wi["down"], **tile.get("down", {}))
            return run

        report = {"tiles()": round(_time_us(layer({})), 2)}
        for o, gu, dn in itertools.product(*CHAIN_TILES.values()):
            tile = {name: {"block_n": bn, "num_warps": warps} for name, (bn, warps) in zip(CHAIN_TILES, (o, gu, dn))}
            report[f"o_proj {o} gate_up {gu} down {dn}"] = round(_time_us(layer(tile)), 2)
        return dict(sorted(report.items(), key=lambda kv: kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="1", help="comma-separated token counts (<= 8)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--sweep", action="store_true", help="also search tile parameters per shape")
    ap.add_argument("--jobs", type=int, default=8, help="processes compiling the sweep's kernels")
    ap.add_argument("--chain", action="store_true",
                    help="only time a layer's one-token GEMVs back to back under tiles() and a grid of tiles")
    args = ap.parse_args()
    import triton
    if not torch.cuda.is_available():
        sys.exit("bench_gemv needs a CUDA device")
    sys.path.insert(0, str(REPO))
    if args.chain:
        print(json.dumps({"device": torch.cuda.get_device_name(), "dtype": args.dtype, "us_per_layer":
                          _chain(getattr(torch, args.dtype))}, indent=2))
        return
    from seis.agents.offline.library import load_library
    from seis.agents.offline.verify import build_candidate

    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="seis-bench-gemv-") as tmp:
        t = {t.name: t for t in load_library()}["triton-gemv"]
        engine_dir = build_candidate(Path(tmp) / "engine", [t])
        ms = [int(v) for v in args.m.split(",")]
        if args.sweep:
            _precompile(engine_dir, ms, args.dtype, args.jobs)
        ops, triton_gemv = _engine(engine_dir)
        report = {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "calls_per_graph": CALLS,
                  "median_of": REPEATS, "results": {}}
        for m in ms:
            for name, (nbytes, fused, unfused, k, n) in _shapes(m, dtype, ops, triton_gemv).items():
                fused_us, e0_us = _time_us(fused), _time_us(unfused)
                tiles = triton_gemv.tiles(m, n, k)
                entry = {"tiles": dict(zip(("block_m", "block_n", "block_k", "num_warps"), tiles)),
                         "fused_us": round(fused_us, 2), "fused_gbps": round(nbytes / fused_us / 1e3, 1),
                         "e0_us": round(e0_us, 2), "e0_gbps": round(nbytes / e0_us / 1e3, 1),
                         "speedup": round(e0_us / fused_us, 3)}
                if args.sweep:
                    entry["best"] = _sweep(fused, m, n, k)
                    entry["best"]["gbps"] = round(nbytes / entry["best"]["us"] / 1e3, 1)
                report["results"][f"{name} m={m}"] = entry
            # A decoder layer's four projections back to back, as the engine runs them: with and without
            # programmatic dependent launch (each GEMV's first W loads overlapping the previous kernel's tail).
            layer = [(v[1], v[3], v[4]) for name, v in _shapes(m, dtype, ops, triton_gemv).items()
                     if name != "lm_head"]
            fns = [f for f, _, _ in layer]
            entry = {f"pdl_{pdl}_us": round(_time_us(lambda i, pdl=pdl: [f(i, pdl=pdl) for f in fns]), 2)
                     for pdl in (False, True)}
            # The same with each program's whole slice of W in one chunk, all of it loaded before the wait for
            # the previous kernel (the default tiles split K = 2048 and 3072 into chunks read after the wait).
            whole = [functools.partial(f, block_k=triton.next_power_of_2(k)) for f, k, _ in layer]
            entry["pdl_True_whole_row_us"] = round(_time_us(lambda i: [f(i, pdl=True) for f in whole]), 2)
            report["results"][f"layer m={m}"] = entry
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
