"""Decode throughput of E0 (per attention backend), of each library transformation alone on E0, and of the
transformations stacked in a given order, all in one run: one request at a time, or --batch requests at once.

    python -m seis.benchmarks.ladder --model qwen3-0.6b-random [--order a,b,c] [--alone] [--also x+y,z]
                                     [--engine LABEL=DIR ...] [--batch 1] [--reps 3] [--json F]

Every engine runs in its own sandboxed process (as the gate runs candidates) and all are alive at once; each
repetition times every engine once, interleaved, on fresh prompts, so drift hits them alike. Throughput counts
the forced new tokens of every request over the wall time of the whole call (prefill included). Each engine's greedy tokens are
compared with E0's on the same prompts (the length of the common prefix is reported). --engine adds an engine
tree from elsewhere (a run's retained engine, an earlier version of a transformation) under its own label.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from .. import tables
from ..agents.offline.library import load_library
from ..agents.offline.merge import with_prerequisites
from ..agents.offline.verify import build_candidate
from ..engine_import import ENGINE_TEMPLATE
from ..provenance import device_label, source_commit, weights_label
from ..stats import fmt_range, summarize
from . import copied_engine, engine_failures_shown, json_out, labelled_dirs, token_outputs


def systems(order: list[str], alone: bool, backends: list[str], work: Path, also: list[list[str]] = (),
            extra: dict[str, Path] | None = None) -> dict[str, tuple[Path, dict]]:
    """name -> (engine dir, engine options)."""
    library = {t.name: t for t in load_library()}
    unknown = [n for n in order + [n for stack in also for n in stack] if n not in library]
    if unknown:
        raise SystemExit(f"not in the library: {', '.join(unknown)} (known: {', '.join(sorted(library))})")
    out = {"E0": (ENGINE_TEMPLATE, {})}
    for b in backends:
        out[f"E0 ({b} attention)"] = (ENGINE_TEMPLATE, {"attention_backend": b})
    for name in order if alone else []:
        t = library[name]  # alone: on E0 with nothing but its prerequisites
        out[f"E0 + {name}"] = (build_candidate(work / f"alone-{name}", with_prerequisites(t)), {})
    for i in range(2 if alone else 1, len(order) + 1):
        steps = order[:i]
        out["E0 + " + " + ".join(steps)] = (build_candidate(work / f"stack-{i}", [library[n] for n in steps]), {})
    for i, steps in enumerate(also):
        out["E0 + " + " + ".join(steps)] = (build_candidate(work / f"also-{i}", [library[n] for n in steps]), {})
    for label, engine_dir in (extra or {}).items():
        if label in out:
            raise SystemExit(f"--engine label {label!r} is taken")
        if not (Path(engine_dir) / "engine" / "engine.py").is_file():
            raise SystemExit(f"--engine {label}={engine_dir}: no engine/engine.py there")
        out[label] = (copied_engine(label, Path(engine_dir), work / f"engine-{len(out)}"), {})
    return out


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    from ..models import resolve_model

    model_dir = resolve_model(args.model)
    info, tokens, times = _time_engines(args, model_dir, _prompts(args, model_dir))
    result = _result(args, info, tokens, times)
    if args.json:  # first: nothing shown below can lose the measurements
        args.json.write_text(json.dumps(result, indent=2))
    print(f"{result['device']}, {args.model}, {args.batch} request(s) at once, prompt {args.prompt_len}, "
          f"{args.new_tokens} forced new tokens each, median (min–max) of {args.reps}, commit {result['commit']}:")
    print(_table(result))
    return result


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b-random")
    ap.add_argument("--order", default="", help="comma-separated transformations, stacked in this order")
    ap.add_argument("--alone", action="store_true", help="also each transformation alone on E0")
    ap.add_argument("--also", default="", help="more stacks beside the ladder: comma-separated, each a+b+c")
    ap.add_argument("--engine", action="append", default=[], metavar="LABEL=DIR",
                    help="also time this engine tree (a folder holding engine/), under LABEL; repeatable")
    ap.add_argument("--backends", default="", help="E0 also with these attention backends, e.g. triton,torch")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1, help="requests sent together in each timed call")
    ap.add_argument("--max-batch-size", type=int, default=None,
                    help="engine slots (default: --batch, at least 8); fewer than --batch queues the rest")
    ap.add_argument("--max-seq-len", type=int, default=2048, help="engine context, which sizes its KV cache")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    json_out(args.json)
    if args.batch < 1:
        raise SystemExit(f"--batch must be at least 1, not {args.batch}")
    if args.max_batch_size is not None and args.max_batch_size < 1:
        raise SystemExit(f"--max-batch-size must be at least 1, not {args.max_batch_size}")
    if args.max_seq_len < args.prompt_len + args.new_tokens:
        raise SystemExit(f"--max-seq-len {args.max_seq_len} is shorter than --prompt-len + --new-tokens "
                         f"({args.prompt_len + args.new_tokens})")
    return args


def _prompts(args: argparse.Namespace, model_dir: Path) -> list[list[list[int]]]:
    """The calls: a warm-up, then one per repetition, each of args.batch random prompts; nothing is served twice."""
    import torch

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    return [[torch.randint(0, min(vocab, 20000), (args.prompt_len,), generator=gen).tolist()
             for _ in range(args.batch)] for _ in range(args.reps + 1)]


def _time_engines(args: argparse.Namespace, model_dir: Path, calls: list[list[list[int]]]
                  ) -> tuple[dict[str, dict], dict[str, list[list[int]]], dict[str, list[float]]]:
    """Every engine started, built and warmed up (calls[0]) in turn, all alive at once; then each repetition's call
    times every engine once, interleaved. Returns per engine: its build reply, options and last stats; the tokens of
    every request it served; its tok/s per repetition."""
    from ..engine_host import EngineProcess
    from ..engine_host.client import Sampling
    from ..engine_host.jit_cache import held_cache, private_cache
    from ..workspace.tree import scratch_dir, tree_hash

    sampling = Sampling(max_new_tokens=args.new_tokens, ignore_eos=True)
    options = {"max_batch_size": args.max_batch_size or max(8, args.batch), "max_seq_len": args.max_seq_len}
    order = [n for n in args.order.split(",") if n]
    backends = [b for b in args.backends.split(",") if b]
    also = [[n for n in stack.split("+") if n] for stack in args.also.split(",") if stack]
    extra = labelled_dirs(args.engine)
    engines: dict[str, EngineProcess] = {}
    info, tokens, times = {}, {}, {}

    def run(name: str, batch: list[list[int]]) -> float:
        tok_per_s, outs = _timed_call(engines[name], name, batch, sampling, args.new_tokens)
        tokens[name].extend(outs)
        return tok_per_s

    # scratch_dir: engines write into their caches; what they leave is removed without following links or recursing.
    # An engine's failure ends the run with its message made printable (an --engine tree may be an agent's).
    with scratch_dir("seis-ladder-") as tmp, scratch_dir("seis-ladder-cache-") as cache, ExitStack() as held, \
            engine_failures_shown():
        # JIT caches (engine_host.jit_cache): E0 keeps the machine's cache for its tree, as vanilla does in the gate;
        # every other engine gets its own copy, made once E0 has warmed up, so kernels E0 compiled are not compiled
        # again (each sandbox runs as its own user, and no engine may write another's cache).
        shared = held.enter_context(held_cache(tree_hash(ENGINE_TEMPLATE), cache / "E0"))
        try:
            for i, (name, (d, opts)) in enumerate(systems(order, args.alone, backends, tmp, also,
                                                          extra).items()):
                t0 = time.perf_counter()
                cache_dir = shared if name == "E0" else private_cache(cache / f"engine-{i}", shared)
                engines[name] = EngineProcess(d, model_dir, {**options, **opts}, timeout_s=900, cache_dir=cache_dir)
                engines[name].start()
                info[name] = {"build": engines[name].build(), "options": engines[name].options,
                              "tree": tree_hash(d)}  # what this row measured
                tokens[name], times[name] = [], []
                run(name, calls[0])  # the first call warms the engine up (kernels compiled, memory grown)
                print(f"built and warmed up {name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr,
                      flush=True)
            for rep, batch in enumerate(calls[1:], 1):
                for name in engines:
                    times[name].append(run(name, batch))
                print(f"repetition {rep} of {args.reps} done", file=sys.stderr, flush=True)
            for name, eng in engines.items():  # counters over every prompt (drafts accepted, graph replays, ...)
                info[name]["stats"] = eng.stats()
        finally:
            for eng in engines.values():
                eng.close()
    return info, tokens, times


def _timed_call(engine, name: str, batch: list[list[int]], sampling, new_tokens: int
                ) -> tuple[float, list[list[int]]]:
    """One generate call of the whole batch: its tok/s over the call's wall time (prefill included) and the outputs,
    each exactly new_tokens long (ignore_eos forces them; anything else is an engine fault)."""
    t0 = time.perf_counter()
    outs = token_outputs(engine, engine.generate(batch, sampling), new_tokens)
    dt = time.perf_counter() - t0
    if [len(o) for o in outs] != [new_tokens] * len(batch):
        raise SystemExit(f"{name} returned {[len(o) for o in outs]} tokens, not {new_tokens} "
                         f"for each of {len(batch)} requests")
    return len(batch) * new_tokens / dt, outs


def _result(args: argparse.Namespace, info: dict[str, dict], tokens: dict[str, list[list[int]]],
            times: dict[str, list[float]]) -> dict:
    """JSON-ready: tok/s and the speedup over E0 (paired per repetition) per engine, and per request how many
    leading greedy tokens equal E0's."""
    ref = tokens["E0"]
    agreement = {n: [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(t, ref)]
                 for n, t in tokens.items()}
    return {
        "benchmark": "ladder", "model": args.model, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "batch": args.batch, "reps": args.reps, "commit": source_commit(), "weights": weights_label(args.model),
        "device": device_label(),
        "tok_per_s": {n: summarize(v) for n, v in times.items()},
        # paired: each repetition's tok/s over E0's in the same repetition (they run interleaved, rep by rep)
        "speedup_vs_e0": {n: summarize([x / e for x, e in zip(v, times["E0"])]) for n, v in times.items()},
        "greedy_prefix_equal_to_e0": agreement,
        "engines": info,
    }


def _table(result: dict) -> str:
    """One row per engine: tok/s, speedup, the shortest prefix equal to E0's, attention backend, drafts."""
    agreement, info = result["greedy_prefix_equal_to_e0"], result["engines"]
    return tables.plain(["engine", "tok/s", "vs E0", "same-as-E0 prefix", "attention", "drafts"],
                        [[n, fmt_range(s), f"x{result['speedup_vs_e0'][n]['median']:.2f}",
                          f"{min(agreement[n])}/{result['new_tokens']}",
                          info[n]["stats"].get("attention_backend", "?"), _draft_summary(info[n]["stats"])]
                         for n, s in result["tok_per_s"].items()])


def _draft_summary(stats: dict) -> str:
    """How a speculating engine's drafts fared (its counters), or nothing for one that does not draft or whose
    counters are not counts (an --engine tree's stats are its own word)."""
    steps, drafted, accepted = (stats.get(k) for k in ("verify_steps", "draft_tokens", "accepted_draft_tokens"))
    if not steps or not all(type(v) is int and v >= 0 for v in (steps, drafted, accepted)):
        return ""
    return f"{accepted}/{drafted} tokens accepted, {1 + accepted / steps:.2f} tokens per verify step"


def _drafts(stats: dict) -> str:
    """_draft_summary as the tail of a line: `  drafts: ...`, or nothing."""
    summary = _draft_summary(stats)
    return f"  drafts: {summary}" if summary else ""


if __name__ == "__main__":
    main()
