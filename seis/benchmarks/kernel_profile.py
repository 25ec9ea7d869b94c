"""Where a decode step's GPU time goes: kernel launches and summed kernel time per step (torch profiler), for one
engine and a batch of requests (a step makes one token for each).

    python -m seis.benchmarks.kernel_profile [--engine-dir DIR | --stack a,b,c] [--batch 1] [--json F]

The engine runs in this process (the profiler needs it), outside any sandbox, with this user's rights: give it
trees you trust (an agent's snapshot is agent-written code; the gate, post-validation and `versus` sandbox
those). Run one process per engine to compare engines. Timed:
--batch requests, each a 100-token prompt and N forced new tokens, after a warm-up batch; the prefill's kernels
are counted too (they are part of the call), so use enough new tokens for the per-step figures to mean decode.
Besides summed kernel time it reports the request's wall time and the time the GPU ran any kernel (the union of
the kernels' intervals): their difference is GPU idle time, and with programmatic dependent launch (kernels that
start early and wait for their predecessor) the union, not the sum, is what the kernels cost.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from .. import tables
from ..provenance import source_commit
from . import json_out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b-random")
    ap.add_argument("--engine-dir", type=Path, default=None, help="default: engine_template (E0)")
    ap.add_argument("--stack", default="", help="offline-library entries stacked on E0, comma-separated")
    ap.add_argument("--batch", type=int, default=1, help="requests decoded together")
    ap.add_argument("--label", default=None)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    json_out(args.json)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..engine_import import ENGINE_TEMPLATE, import_engine
    from ..models import resolve_model

    engine_dir = args.engine_dir or ENGINE_TEMPLATE
    if args.stack:  # built before the device check: a misspelt entry is found on any machine
        from .versus import engine_trees
        stack = [("stack", args.stack.split(","))]
        engine_dir = engine_trees(stack, {}, [], Path(), Path(tempfile.mkdtemp()))["stack"]
    if not torch.cuda.is_available():
        raise SystemExit("kernel_profile needs a CUDA device")
    model_dir = resolve_model(args.model)
    E = import_engine(engine_dir)
    eng = E.Engine(model_dir, E.EngineOptions(max_batch_size=max(8, args.batch), max_seq_len=2048)).build()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 20000, (args.prompt_len,), generator=gen).tolist() for _ in range(2 * args.batch)]
    sp = E.SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    eng.generate(prompts[: args.batch], sp)  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        eng.generate(prompts[args.batch :], sp)
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    intervals = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and not ev.name.startswith(("Memcpy", "Memset")):
            per_kernel[ev.name][0] += 1
            per_kernel[ev.name][1] += ev.device_time_total  # microseconds
            intervals.append((ev.time_range.start, ev.time_range.end, ev.name))
    launches = sum(c for c, _ in per_kernel.values())
    total_us = sum(t for _, t in per_kernel.values())
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[: args.top]
    n = args.new_tokens  # decode steps
    label = args.label or (f"E0 + {args.stack}" if args.stack else str(args.engine_dir or "E0"))
    result = {
        "benchmark": "kernel_profile", "label": label, "model": args.model, "commit": source_commit(),
        "device": torch.cuda.get_device_name(), "batch": args.batch, "new_tokens": n,
        "kernels_per_step": launches / n, "kernel_us_per_step": total_us / n,
        "busy_us_per_step": busy_us(intervals) / n, "wall_us_per_step": wall_us / n,
        "largest_idle_gaps": idle_gaps(intervals, 12), "idle_us_per_step_after": idle_after(intervals, n, 8),
        "attention_backend": eng.stats()["attention_backend"],
        "top": [{"kernel": k[:90], "calls_per_step": c / n, "us_per_step": t / n} for k, (c, t) in top],
    }
    print(f"{label}: {result['kernels_per_step']:.1f} kernels and {result['kernel_us_per_step']:.0f} µs of kernel "
          f"time per decode step of {args.batch} request(s), GPU busy {result['busy_us_per_step']:.0f} µs of "
          f"{result['wall_us_per_step']:.0f} µs wall ({result['device']}, {args.model}, {n} tokens each)")
    print(tables.plain(["µs / step", "calls / step", "kernel"],
                       [[f"{r['us_per_step']:.1f}", f"{r['calls_per_step']:.1f}x", r["kernel"]]
                        for r in result["top"]],
                       align=("right", "right", "left")))
    print("idle per step, by the kernel before it:", result["idle_us_per_step_after"])
    print("largest idle gaps:")
    print(tables.plain(["idle µs", "after", "before"],
                       [[f"{g['us']:.1f}", g["after"], g["before"]] for g in result["largest_idle_gaps"]],
                       align=("right", "left", "left")))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def busy_us(intervals: list[tuple[float, float, str]]) -> float:
    """Length of the union of the [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end, _ in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def idle_gaps(intervals: list[tuple[float, float, str]], top: int) -> list[dict]:
    """The longest stretches in which no kernel ran, with the kernels on either side, and the summed idle time
    of the gaps after each kernel (where the GPU waits)."""
    gaps, reach, last = [], None, ""
    for start, end, name in sorted(intervals):
        if reach is not None and start > reach:
            gaps.append({"us": round(start - reach, 1), "after": last[:60], "before": name[:60]})
        if reach is None or end > reach:
            reach, last = end, name
    return sorted(gaps, key=lambda g: -g["us"])[:top]


def idle_after(intervals: list[tuple[float, float, str]], per: int, top: int) -> dict[str, float]:
    """Idle time per `per` steps summed by the kernel that ran last before it, largest first."""
    by: dict[str, float] = defaultdict(float)
    for g in idle_gaps(intervals, len(intervals)):
        by[g["after"]] += g["us"] / per
    return dict(sorted(((k, round(v, 1)) for k, v in by.items()), key=lambda kv: -kv[1])[:top])


if __name__ == "__main__":
    main()
