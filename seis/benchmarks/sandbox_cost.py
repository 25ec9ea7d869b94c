"""What the sandbox costs: starting a sandboxed process, one request round trip, and freezing the other engines
around a timed request.

    python -m seis.benchmarks.sandbox_cost [--model tiny-qwen3] [--reps 20]

Prints median (min-max) milliseconds over --reps repetitions.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.2f} ({min(values) * 1e3:.2f}–{max(values) * 1e3:.2f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m seis.benchmarks.sandbox_cost")
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)

    from ..engine_host import EngineProcess
    from ..engine_import import ENGINE_TEMPLATE
    from ..models import resolve_model
    from ..sandbox import SandboxedProcess, SandboxPolicy, allowed_env, bwrap_version

    print(bwrap_version())
    plain, boxed = [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        box = SandboxedProcess([sys.executable, "-c", "pass"], SandboxPolicy(binds=(), env=allowed_env()))
        box.start().wait()
        box.kill()
        boxed.append(time.perf_counter() - t0)
    print(f"python -c pass, plain:      {_ms(plain)} ms")
    print(f"python -c pass, sandboxed:  {_ms(boxed)} ms (start, exit and the check that nothing is left)")

    model = resolve_model(args.model)
    options = {"device": args.device, "max_seq_len": 256}
    with EngineProcess(ENGINE_TEMPLATE, model, options) as a, EngineProcess(ENGINE_TEMPLATE, model, options) as b:
        t0 = time.perf_counter()
        a.build()
        b.build()
        print(f"two engines started and built: {(time.perf_counter() - t0):.2f} s")
        rtt, freeze = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            a.stats()
            rtt.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b.box.freeze()
            b.box.thaw()
            freeze.append(time.perf_counter() - t0)
        print(f"request round trip (stats): {_ms(rtt)} ms")
        print(f"freeze + thaw one engine:   {_ms(freeze)} ms ({len(b.pids())} processes in its sandbox)")


if __name__ == "__main__":
    main()
