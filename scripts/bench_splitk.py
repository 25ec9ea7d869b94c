"""A split-K tensor-core projection for batched decode (3 to 64 rows) against cuBLAS and E0's layer, at Qwen3-0.6B
shapes: the measurement behind the question whether batched projections can beat cuBLAS (docs/benchmarks.md).

    python scripts/bench_splitk.py [--m 8,32] [--json F]     (CUDA)
    TRITON_INTERPRET=1 python scripts/bench_splitk.py --check   (CPU, float32)

The kernel: y[M, N] = prologue(x)[M, K] @ W[N, K]^T. A program owns BLOCK_N rows of W and one of SPLIT equal K
ranges; it multiplies its W tile by the rows (padded to 16) on tensor cores, W on the left, into float32, writes
the partial, and the last program of its N tile to finish (an atomic counter, reset for the next launch) adds the
partials in split order (deterministic) and writes y. The prologue is none, add-RMSNorm (each program sums the
squares of the whole row first; program (0, 0) writes the new residual) or SiLU-and-mul, with E0's rounding points.
With programmatic dependent launch the first W chunk loads before the wait for the previous kernel.

Timed, each inside one CUDA graph over 28 layers' weights (W streamed from memory, as a decode step reads it): each
projection alone for every tile (block_n x block_k x split) against F.linear; then one decoder layer's four
projections with what sits between them (no attention): E0's sequence (its add-RMSNorm and SiLU-and-mul kernels,
cuBLAS), the same with the split-K kernel for cuBLAS, and the split-K kernel with the norms and SiLU fused in.
Microseconds per layer, median (min-max) of 7.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from decoder_layers import HIDDEN, INTERMEDIATE, LAYERS, Q_OUT, random_layers
from seis.benchmarks.graph_timing import graph_times
from seis.stats import fmt_range, summarize

NONE, ADD_RMSNORM, SILU_MUL = 0, 1, 2


@triton.jit
def _input(X, R, offs_m, m_mask, offs_k, K, stride_x, stride_r, PROLOGUE: tl.constexpr):
    # Columns offs_k of the projection's input rows in float32, before the norm's scaling.
    mask = m_mask[:, None] & (offs_k < K)[None, :]
    ptr = X + offs_m[:, None] * stride_x + offs_k[None, :]
    x = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    dt = X.dtype.element_ty
    if PROLOGUE == 1:
        r = tl.load(R + offs_m[:, None] * stride_r + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        x = (x + r).to(dt).to(tl.float32)
    if PROLOGUE == 2:
        up = tl.load(ptr + K, mask=mask, other=0.0).to(tl.float32)
        x = ((x * tl.sigmoid(x)).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)
    return x


@triton.jit
def _splitk_kernel(X, R, RES, NW, W, Y, PART, COUNT, M, N, eps, stride_x, stride_r, stride_res, stride_y, k_per,
                   K: tl.constexpr, SPLIT: tl.constexpr, PROLOGUE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    k_lo = pid_k * k_per
    w_rows = W + offs_n.to(tl.int64)[:, None] * K
    offs_k = k_lo + tl.arange(0, BLOCK_K)
    # Weights are never written: their first chunk streams while the previous kernel finishes (PDL).
    w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k < K)[None, :], other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    dt = X.dtype.element_ty
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PROLOGUE == 1:  # every program needs each row's whole sum of squares
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        first = (pid_n == 0) & (pid_k == 0)
        for k0 in tl.static_range(0, K, BLOCK_K):
            offs = k0 + tl.arange(0, BLOCK_K)
            h = _input(X, R, offs_m, m_mask, offs, K, stride_x, stride_r, PROLOGUE)
            tl.store(RES + offs_m[:, None] * stride_res + offs[None, :], h.to(RES.dtype.element_ty),
                     mask=m_mask[:, None] & (offs < K)[None, :] & first)
            ss += tl.sum(h * h, axis=1)
        rstd = tl.rsqrt(ss / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for i in tl.range(0, k_per // BLOCK_K):
        offs_k = k_lo + i * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        h = _input(X, R, offs_m, m_mask, offs_k, K, stride_x, stride_r, PROLOGUE)
        if PROLOGUE == 1:
            nw = tl.load(NW + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            h = (h * rstd[:, None]).to(dt).to(tl.float32) * nw[None, :]
        if i > 0:
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(w, tl.trans(h.to(dt)), acc)
    out_mask = n_mask[:, None] & m_mask[None, :]
    y_ptr = Y + offs_m[None, :] * stride_y + offs_n[:, None]
    if SPLIT == 1:
        tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=out_mask)
    else:
        tl.store(PART + (pid_k * N + offs_n)[:, None] * BLOCK_M + offs_m[None, :], acc, mask=n_mask[:, None])
        # Every thread's partial is written before the counter moves; the last program acquires them all.
        tl.debug_barrier()
        finished = tl.atomic_add(COUNT + pid_n, 1, sem="acq_rel")
        if finished == SPLIT - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for sp in tl.static_range(0, SPLIT):
                total += tl.load(PART + (sp * N + offs_n)[:, None] * BLOCK_M + offs_m[None, :],
                                 mask=n_mask[:, None], other=0.0, cache_modifier=".cg")
            tl.store(y_ptr, total.to(Y.dtype.element_ty), mask=out_mask)
            tl.store(COUNT + pid_n, 0)


class Scratch:
    """Partials and per-N-tile counters, allocated once (CUDA graphs replay fixed addresses)."""

    def __init__(self, device, floats: int = 16 << 20, tiles: int = 4096):
        self.part = torch.empty(floats, dtype=torch.float32, device=device)
        self.count = torch.zeros(tiles, dtype=torch.int32, device=device)


def splitk_linear(x, w, scratch, prologue=NONE, residual=None, norm_w=None, res_out=None, eps=1e-6, split=1,
                  block_n=64, block_k=128, pdl=False):
    """y = prologue(x) @ w.T; with ADD_RMSNORM, res_out receives x + residual."""
    m = x.shape[0]
    n, k = w.shape
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    block_m = max(16, triton.next_power_of_2(m))
    block_k = min(block_k, triton.next_power_of_2(k))
    k_per = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_per)  # no empty splits
    tiles = triton.cdiv(n, block_n)
    assert split * n * block_m <= scratch.part.numel() and tiles <= scratch.count.numel()
    if prologue == ADD_RMSNORM:
        assert residual is not None and norm_w is not None and res_out is not None
    r = residual if residual is not None else x
    res = res_out if res_out is not None else x
    _splitk_kernel[(tiles, split)](
        x, r, res, norm_w if norm_w is not None else x, w, y, scratch.part, scratch.count, m, n, eps, x.stride(0),
        r.stride(0), res.stride(0), y.stride(0), k_per, K=k, SPLIT=split, PROLOGUE=prologue, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, num_warps=4, num_stages=3,
        **({"launch_pdl": True} if pdl else {}))
    return y


def reference(x, w, prologue=NONE, residual=None, norm_w=None, eps=1e-6):
    """(y, new residual or None) in float32 with the kernel's rounding points."""
    dt, xf, res = x.dtype, x.float(), None
    if prologue == ADD_RMSNORM:
        xf = (xf + residual.float()).to(dt).float()
        res = xf.to(dt)
        xf = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dt).float() * norm_w.float()
    if prologue == SILU_MUL:
        gate, up = xf[:, : w.shape[1]], xf[:, w.shape[1]:]
        xf = ((gate * torch.sigmoid(gate)).to(dt).float() * up).to(dt).float()
    return xf.to(dt).float() @ w.float().T, res


def check() -> None:
    """Under the interpreter (float32): every prologue, uneven N, K split unevenly, 1 to 32 rows."""
    g = torch.Generator().manual_seed(0)
    scratch = Scratch("cpu", floats=1 << 20, tiles=256)
    cases = [(3, 96, 256, ADD_RMSNORM, 2, 32, 64), (8, 64, 192, SILU_MUL, 3, 32, 64), (17, 50, 128, NONE, 1, 16, 32),
             (5, 40, 64, NONE, 2, 16, 32), (32, 64, 512, ADD_RMSNORM, 4, 32, 64), (1, 33, 96, SILU_MUL, 2, 16, 32)]
    for m, n, k, prologue, split, block_n, block_k in cases:
        x = torch.randn(m, 2 * k if prologue == SILU_MUL else k, generator=g)
        w, r, nw = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g), torch.randn(k, generator=g)
        res_out = torch.full((m, k), float("nan")) if prologue == ADD_RMSNORM else None
        y = splitk_linear(x, w, scratch, prologue, r, nw, res_out, split=split, block_n=block_n, block_k=block_k)
        want, res = reference(x, w, prologue, r, nw)
        err = (y - want).abs().max().item()
        assert err <= 1e-4 * max(1.0, want.abs().max().item()), (m, n, k, prologue, split, err)
        if res is not None:
            assert torch.equal(res_out, res), "new residual"
        assert scratch.count.abs().sum().item() == 0, "counters not reset"
    print(f"split-K kernel: {len(cases)} cases equal to the reference")


def _layer_us(fn, calls: int) -> list[float]:
    """Microseconds per call of fn(i) for i < calls in one CUDA graph, sorted: 7 timings of 10 replays."""
    return graph_times(fn, calls, repeats=7, replays=10)


def bench(batch_rows: list[int]) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine_template"))
    from engine.kernels import triton_ops as e0  # E0's add-RMSNorm and SiLU-and-mul kernels

    dev, dt, F = torch.device("cuda"), torch.bfloat16, torch.nn.functional
    torch.manual_seed(0)
    scratch = Scratch(dev)
    layers = random_layers(dev, dt)
    inputs = {"qkv": HIDDEN, "o": Q_OUT, "gate_up": HIDDEN, "down": INTERMEDIATE}
    report = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "layers_per_graph": LAYERS, "rows": []}
    for m in batch_rows:
        row = {"m": m, "projections": {}}
        tiles = {}
        for name, k_in in inputs.items():
            x = torch.randn(m, k_in, device=dev, dtype=dt)
            weights = [layer[name] for layer in layers]
            ref = F.linear(x.float(), weights[0].float())
            cublas = _layer_us(lambda i: F.linear(x, weights[i]), LAYERS)
            timed = []
            for block_n, block_k, split in itertools.product((32, 64), (128, 256), (1, 2, 4, 8)):
                if block_k * split > k_in or (split == 8) != (name == "down") and split in (1, 8):
                    continue
                cfg = {"block_n": block_n, "block_k": block_k, "split": split}
                err = (splitk_linear(x, weights[0], scratch, **cfg).float() - ref).abs().max().item()
                us = _layer_us(lambda i: splitk_linear(x, weights[i], scratch, pdl=True, **cfg), LAYERS)
                timed.append({**cfg, **summarize(us), "max_abs_err": round(err, 5)})
            timed.sort(key=lambda t: t["median"])
            tiles[name] = {k: timed[0][k] for k in ("block_n", "block_k", "split")}
            row["projections"][name] = {"cublas": summarize(cublas), "best": timed[0], "all": timed}
            print(f"m={m} {name}: cuBLAS {fmt_range(row['projections'][name]['cublas'], 2)} us, split-K "
                  f"{fmt_range(timed[0], 2)} us {tiles[name]}", flush=True)
        x0 = torch.randn(m, HIDDEN, device=dev, dtype=dt)
        attn = torch.randn(m, Q_OUT, device=dev, dtype=dt)

        state = {}  # the hidden state and residual one layer hands the next

        def carried(i):
            return (x0, torch.zeros_like(x0)) if i == 0 else (state["h"], state["r"])

        def e0_layer(linear):
            def one(i):
                p, (h, r) = layers[i], carried(i)
                hn, r = e0.add_rmsnorm(h, r, p["norm1"], 1e-6)
                linear(hn, p["qkv"], "qkv")
                h = linear(attn, p["o"], "o")
                hn, r = e0.add_rmsnorm(h, r, p["norm2"], 1e-6)
                state["h"] = linear(e0.silu_and_mul(linear(hn, p["gate_up"], "gate_up")), p["down"], "down")
                state["r"] = r
            return one

        def fused_layer(i):
            p, (h, r) = layers[i], carried(i)
            new_r = torch.empty_like(r)
            splitk_linear(h, p["qkv"], scratch, ADD_RMSNORM, r, p["norm1"], new_r, pdl=True, **tiles["qkv"])
            h = splitk_linear(attn, p["o"], scratch, pdl=True, **tiles["o"])
            state["r"] = torch.empty_like(r)
            gu = splitk_linear(h, p["gate_up"], scratch, ADD_RMSNORM, new_r, p["norm2"], state["r"], pdl=True,
                               **tiles["gate_up"])
            state["h"] = splitk_linear(gu, p["down"], scratch, SILU_MUL, pdl=True, **tiles["down"])

        row["layer_us"] = {
            "E0 (add-RMSNorm, SiLU-and-mul kernels, cuBLAS)": summarize(_layer_us(
                e0_layer(lambda x, w, name: F.linear(x, w)), LAYERS)),
            "E0's kernels, split-K for cuBLAS (PDL)": summarize(_layer_us(
                e0_layer(lambda x, w, name: splitk_linear(x, w, scratch, pdl=True, **tiles[name])), LAYERS)),
            "split-K with the norms and SiLU fused in (PDL)": summarize(_layer_us(fused_layer, LAYERS)),
        }
        print(f"m={m} layer: {json.dumps(row['layer_us'])}", flush=True)
        report["rows"].append(row)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="correctness under TRITON_INTERPRET=1 (CPU)")
    ap.add_argument("--m", default="8,32", help="decode rows")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.check:
        check()
        return
    if not torch.cuda.is_available():
        sys.exit("bench_splitk needs a CUDA device (or --check under TRITON_INTERPRET=1)")
    report = bench([int(v) for v in args.m.split(",")])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
