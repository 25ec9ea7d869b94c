"""What each kind of kernel costs a decode step on its critical path: the engine timed whole, then with one
primitive at a time made a stub that launches nothing (timing only: the outputs are meaningless).

    python scripts/bench_ablation.py [--stack a,b,c] [--batches 1,8,32] [--reps 3] [--json F]     (CUDA)

The engine is E0 with the library entries of --stack (default: the eight-entry stack), built into a temporary folder;
the model is qwen3-0.6b-random. Each variant builds its own engine (its decode graphs captured with the stub in
place) and runs the versus benchmark's random workload: 100-token prompts, 256 forced new tokens, a warm-up call
then --reps calls per batch size. A stub's saving, full step time minus the step time without that primitive, is
what the primitive adds to the step once programmatic dependent launch has overlapped what it can: the summed
kernel times of a profile count a kernel's wait for its predecessor as its own time, this does not.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BEST_STACK = ("triton-gemv,prefill-cuda-graphs,fused-decode-attention,fused-qk-rope-store,greedy-multistep-decode,"
              "gate-up-silu-epilogue,overlapped-greedy-chunks,batched-mlp-matmuls")


MAX_ROWS = 4096  # a prefill of 32 prompts of 100 tokens fits
_ZEROS: dict = {}


def _empty(x, rows: int, cols: int):
    """rows x cols zeros without a kernel: a view of a buffer zeroed once per width (a stub's output must be finite,
    or garbage reaches the sampler as NaN logits and an out-of-range token)."""
    import torch
    key = (cols, x.dtype, x.device)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros(MAX_ROWS, cols, dtype=x.dtype, device=x.device)
    return _ZEROS[key][:rows] if rows <= MAX_ROWS else x.new_zeros(rows, cols)


# variant -> {(module under engine.kernels, function): stub}. Each stub takes the function's arguments and returns
# zeros of the result's shape (_empty: no kernel), or its input where the primitive returns a view of it; a
# residual is passed on as the input (the add is skipped with the norm). Prefill's calls of the same functions are
# stubbed too (a small share of a request's time at 256 new tokens).
STUBS = {
    "QKV projection (with its add-RMSNorm)": {
        ("triton_ops", "norm_linear"): lambda x, residual, nw, eps, w, bias=None: (_empty(x, x.shape[0], w.shape[0]), x)},
    "q/k norm, RoPE and KV write": {
        ("triton_ops", "qk_norm_rope_store"): lambda q, *args, **kw: q},
    "decode attention": {
        ("triton_attention", "paged_decode"): lambda *args, **kw: None},
    "O and down projections": {
        ("triton_ops", "linear"): lambda x, w: _empty(x, x.shape[0], w.shape[0])},
    "gate-up projection with SiLU-and-mul (with its add-RMSNorm)": {
        ("triton_ops", "norm_linear_silu_mul"): lambda x, residual, nw, eps, gate_up:
            (_empty(x, x.shape[0], gate_up.shape[0] // 2), x)},
    "LM head (with the final norm)": {
        ("triton_ops", "norm_linear_rows"): lambda x, residual, rows, nw, eps, w: _empty(x, rows.shape[0], w.shape[0])},
}
UNSTUBBED = {"bounded-greedy-head", "batched-bounded-greedy-head"}  # entries whose kernels no stub above replaces
STUBS["every decoder-layer kernel"] = {k: v for name, stubs in STUBS.items() if not name.startswith("LM head")
                                       for k, v in stubs.items()}


def stub_targets(engine_dir: Path) -> dict[tuple[str, str], object]:
    """The engine's functions the stubs replace, imported from engine_dir (AttributeError if one is gone)."""
    from seis.engine_import import import_engine
    import_engine(engine_dir)
    return {(mod, fn): getattr(importlib.import_module(f"engine.kernels.{mod}"), fn)
            for stubs in STUBS.values() for mod, fn in stubs}


def measure(E, model_dir: Path, batches: list[int], reps: int, prompts: dict) -> dict[int, list[float]]:
    """tok/s per repetition for each batch size, one engine built for all of them."""
    import time

    import torch
    eng = E.Engine(model_dir, E.EngineOptions(max_batch_size=max(batches), max_seq_len=512)).build()
    sp = E.SamplingParams(max_new_tokens=256, ignore_eos=True)
    out = {}
    for b in batches:
        eng.generate(prompts[b][0], sp)  # warm-up: this batch size's graphs and kernels
        out[b] = []
        for call in prompts[b][1:]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gens = eng.generate(call, sp)
            torch.cuda.synchronize()
            out[b].append(sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0))
    del eng
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default=BEST_STACK, help="library entries on E0, comma-separated")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if UNSTUBBED & set(args.stack.split(",")):
        # the LM-head stub replaces the full head, which such a stack skips in greedy steps: its row would read 0
        sys.exit(f"bench_ablation has no stub for {', '.join(sorted(UNSTUBBED))}: leave them out of --stack")
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_ablation needs a CUDA device")
    from seis.provenance import source_commit
    from seis.benchmarks.versus import engine_trees, workloads
    from seis.models import resolve_model
    from seis.models.model_config import read_model_config
    from seis.stats import fmt_range, summarize

    batches = [int(b) for b in args.batches.split(",")]
    model_dir = Path(resolve_model("qwen3-0.6b-random"))
    prompts = {b: calls for (_, b), calls in workloads(model_dir, batches, args.reps, 100, gsm8k=False).items()}
    tree = engine_trees([("stack", args.stack.split(","))], {}, [], Path(), Path(tempfile.mkdtemp()))["stack"]
    originals = stub_targets(tree)
    E = sys.modules["engine"]
    modules = {mod: importlib.import_module(f"engine.kernels.{mod}") for mod, _ in originals}
    cfg = read_model_config(model_dir)
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    probe = torch.empty(0, dtype=torch.bfloat16, device="cuda")
    for cols in (cfg.hidden_size, cfg.raw["intermediate_size"], qkv, cfg.vocab_size):
        _empty(probe, 0, cols)  # every width a stub returns, zeroed before any graph is captured
    report = {"device": torch.cuda.get_device_name(), "commit": source_commit(), "stack": args.stack,
              "weights": "random", "variants": {}}
    for variant in ["none (the whole engine)", *STUBS]:
        stubs = STUBS.get(variant, {})
        for (mod, fn), stub in stubs.items():
            setattr(modules[mod], fn, stub)
        try:
            tps = measure(E, model_dir, batches, args.reps, prompts)
        finally:
            for (mod, fn), original in originals.items():
                setattr(modules[mod], fn, original)
        report["variants"][variant] = {str(b): summarize(v) for b, v in tps.items()}
        print(f"{variant}: " + ", ".join(f"batch {b} {fmt_range(summarize(v), 0)} tok/s" for b, v in tps.items()),
              flush=True)
    for per_batch in report["variants"].values():
        for b, s in per_batch.items():
            s["step_us"] = 1e6 * int(b) / s["median"]  # a step makes b tokens
    full = report["variants"]["none (the whole engine)"]
    for per_batch in report["variants"].values():  # what a step spends on what the variant removed
        for b, s in per_batch.items():
            s["saved_us_per_step"] = full[b]["step_us"] - s["step_us"]
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
