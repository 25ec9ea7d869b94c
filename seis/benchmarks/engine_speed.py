"""Single-request decode throughput of E0 (with and without CUDA graphs) and of HF transformers, in one run.

    python -m seis.benchmarks.engine_speed --model qwen3-0.6b-random [--prompt-len 100] [--new-tokens 256]
                                           [--engine-dir DIR] [--skip-hf]

With --engine-dir the engine there replaces E0 (rows named after its directory); it is imported into this
process, outside any sandbox, so give it trees you trust (the gate, post-validation and `versus` sandbox
agent-written ones). With --new-tokens 1 a request is
its prefill alone, so tok/s is 1 / time to first token.

Each repetition times every system once, interleaved, so drift hits all of them alike. Throughput counts the
forced new tokens over the wall time of the whole request (prefill included).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .. import tables
from ..provenance import device_label, source_commit, weights_label
from ..stats import fmt_range, summarize
from . import json_out


def _sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b-random")
    ap.add_argument("--engine-dir", default=None, help="engine to measure (default: engine_template, i.e. E0)")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    json_out(args.json)

    import torch
    from ..engine_import import ENGINE_TEMPLATE, import_engine
    from ..models import resolve_model

    model_dir = resolve_model(args.model)
    eng_mod = import_engine(args.engine_dir or ENGINE_TEMPLATE)
    from ..models.model_config import read_model_config
    vocab = read_model_config(model_dir).vocab_size
    prompt = torch.randint(0, min(vocab, 20000), (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    sp = eng_mod.SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)

    systems = {}
    label = Path(args.engine_dir).name if args.engine_dir else "E0"
    for name, graphs in ((f"{label} + CUDA graphs", True), (f"{label} eager", False)):
        eng = eng_mod.Engine(model_dir, eng_mod.EngineOptions(max_batch_size=8, max_seq_len=2048,
                                                              use_cuda_graphs=graphs)).build()

        def run(eng=eng):
            out = eng.generate([prompt], sp)[0]
            assert len(out.token_ids) == args.new_tokens
        systems[name] = (run, eng.stats())
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        ids = torch.tensor([prompt], device=device)

        def run_hf():
            with torch.inference_mode():
                out = hf.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                  do_sample=False, pad_token_id=0)
            assert out.shape[1] == args.prompt_len + args.new_tokens
        systems["HF transformers eager"] = (run_hf, {"attn_implementation": hf.config._attn_implementation})

    for run, _ in systems.values():  # warm-up (Triton compile, cuBLAS heuristics)
        run()
    times = {name: [] for name in systems}
    for _ in range(args.reps):
        for name, (run, _) in systems.items():
            _sync()
            t0 = time.perf_counter()
            run()
            _sync()
            times[name].append(args.new_tokens / (time.perf_counter() - t0))

    result = {
        "benchmark": "engine_speed", "model": args.model, "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens, "reps": args.reps, "commit": source_commit(),
        "weights": weights_label(args.model), "device": device_label(),
        "torch": torch.__version__,
        "tok_per_s": {name: summarize(v) for name, v in times.items()},
        "systems": {name: info for name, (_, info) in systems.items()},
    }
    print(f"{result['device']}, {args.model}, prompt {args.prompt_len}, {args.new_tokens} forced new tokens, "
          f"median (min–max) of {args.reps}:")
    print(tables.plain(["system", "tok/s"], [[name, fmt_range(s)] for name, s in result["tok_per_s"].items()]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
