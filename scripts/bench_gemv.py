"""Time the triton-gemv library transformation's fused GEMVs against E0's unfused sequence at Qwen3-0.6B shapes.

    python scripts/bench_gemv.py [--m 1,2,4,8] [--dtype bfloat16] [--sweep]

Each variant runs as 200 back-to-back calls inside one CUDA graph (launch overhead as the engine sees it under
graphs); the time is the median of 5 replays, per call. Prints one JSON object: per shape and M, microseconds per
call and the GB/s that W (plus activations) would need, for the fused kernel (default tiles) and for E0's
F.linear + separate norm / activation kernels. --sweep also times BLOCK_N x BLOCK_K x num_warps combinations and
reports the best, to retune triton_gemv.tiles() on a new GPU. Needs CUDA; builds E0 + triton-gemv in a temp dir.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
CALLS, REPEATS = 200, 5
HIDDEN, Q, QKV, INTER, VOCAB = 1024, 2048, 4096, 3072, 151936  # Qwen3-0.6B
EPS = 1e-6


def _time_us(fn) -> float:
    """Median over REPEATS graph replays of CALLS back-to-back fn() calls, in microseconds per call."""
    for _ in range(2):  # compile / warm up outside the capture
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return statistics.median(times)


def _shapes(m: int, dtype: torch.dtype, ops, gemv):
    """name -> (bytes moved, fused(**tile), unfused(), K, N) for the five projections of a layer + the LM head."""
    import torch.nn.functional as F
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.05).to(dtype)

    x, r, a, gu = rnd(m, HIDDEN), rnd(m, HIDDEN), rnd(m, Q), rnd(m, 2 * INTER)
    nw = rnd(HIDDEN) + 1
    w = {"qkv": rnd(QKV, HIDDEN), "o_proj": rnd(HIDDEN, Q), "gate_up": rnd(2 * INTER, HIDDEN),
         "down": rnd(HIDDEN, INTER), "lm_head": rnd(VOCAB, HIDDEN)}
    rows = torch.arange(m, device="cuda")
    size = torch.finfo(dtype).bits // 8

    def moved(name, k_in):
        n, k = w[name].shape
        return (n * k + m * (k_in + n)) * size

    return {
        # E0's add_rmsnorm is in place: the unfused variants run on copies made once (values drift; timing doesn't).
        "qkv": (moved("qkv", 2 * HIDDEN), lambda **t: gemv.norm_gemv(x, r, nw, EPS, w["qkv"], **t),
                lambda xs=x.clone(), rs=r.clone(): F.linear(ops.add_rmsnorm(xs, rs, nw, EPS)[0], w["qkv"]),
                HIDDEN, QKV),
        "o_proj": (moved("o_proj", Q), lambda **t: gemv.gemv(a, w["o_proj"], **t),
                   lambda: F.linear(a, w["o_proj"]), Q, HIDDEN),
        "gate_up": (moved("gate_up", 2 * HIDDEN), lambda **t: gemv.norm_gemv(x, r, nw, EPS, w["gate_up"], **t),
                    lambda xs=x.clone(), rs=r.clone(): F.linear(ops.add_rmsnorm(xs, rs, nw, EPS)[0], w["gate_up"]),
                    HIDDEN, 2 * INTER),
        "down": (moved("down", 2 * INTER), lambda **t: gemv.silu_mul_gemv(gu, w["down"], **t),
                 lambda: F.linear(ops.silu_and_mul(gu), w["down"]), INTER, HIDDEN),
        "lm_head": (moved("lm_head", 2 * HIDDEN),
                    lambda **t: gemv.norm_gemv(x, r, nw, EPS, w["lm_head"], rows=rows, **t),
                    lambda xs=x.clone(), rs=r.clone(): F.linear(
                        ops.add_rmsnorm(xs, rs, nw, EPS)[0].index_select(0, rows), w["lm_head"]),
                    HIDDEN, VOCAB),
    }


def _sweep(fused, m: int, n: int, k: int) -> dict:
    import triton
    best = None
    for block_n, block_k, warps in itertools.product((4, 8, 16, 32, 64, 128), (64, 128, 256, 512, 1024, 2048),
                                                     (2, 4, 8)):
        if (triton.next_power_of_2(m) * block_n * block_k > 4096 * warps or block_k > triton.next_power_of_2(k)
                or block_n * block_k < 256 * warps):
            continue  # > 128 accumulators a thread, wider than the row, or under 8 W elements a thread
        us = _time_us(lambda: fused(block_n=block_n, block_k=block_k, num_warps=warps))
        if best is None or us < best["us"]:
            best = {"us": round(us, 2), "block_n": block_n, "block_k": block_k, "num_warps": warps,
                    "programs": -(-n // block_n)}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="1", help="comma-separated token counts (<= 8)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--sweep", action="store_true", help="also search tile parameters per shape")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gemv needs a CUDA device")
    sys.path.insert(0, str(REPO))
    from seis.agents.offline.library import load_library
    from seis.agents.offline.verify import build_candidate
    from seis.engine_import import import_engine

    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="seis-bench-gemv-") as tmp:
        t = {t.name: t for t in load_library()}["triton-gemv"]
        import_engine(build_candidate(Path(tmp) / "engine", [t]))
        from engine.kernels import Ops, triton_gemv, triton_ops
        ops = Ops("triton", triton_ops)
        report = {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "calls_per_graph": CALLS,
                  "median_of": REPEATS, "results": {}}
        for m in (int(v) for v in args.m.split(",")):
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
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
