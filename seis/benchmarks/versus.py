"""Side by side: vanilla mini-sglang, E0 and any SEIS engines, on the same prompts at several batch sizes, in one run.

    python -m seis.benchmarks.versus --model qwen3-0.6b-random [--stack [LABEL=]a,b,c ...] [--engine LABEL=DIR]
                                     [--snapshot ID] [--batches 1,8,32] [--reps 3] [--minisgl auto|on|off]
                                     [--call-timeout 300] [--json F]

Two workloads at every batch size: `random` (--prompt-len random token ids, exactly --new-tokens forced new tokens:
the decode shape of the speed issue) and `gsm8k` (GSM8K test questions with the model's chat template where it has
one, greedy, EOS on, at most --new-tokens: natural length; with vanilla mini-sglang in the run every system stops
on the ids vanilla stops on, its tokenizer's EOS, so that all of them stop where it would). Each batch is sent as
one call; every repetition uses fresh prompts and times every system once, in rotating order, so drift hits them
alike. tok/s = generated tokens
of the call / its wall time (prefill included); median (min–max) over repetitions; ratios are paired per repetition
(same prompts) against the baseline: vanilla mini-sglang when it is importable (`minisgl`, from
sgl-project/mini-sglang), else E0, and the table says which.

SEIS engines run in their sandboxed processes (as the gate runs them); mini-sglang runs in its own process through
its own offline API (`seis.benchmarks.minisgl_worker`). The systems are built at the same time (each build is its
own process: model load, kernel compilation, CUDA-graph capture) and timed one after another once all are up.
Progress goes to stderr, each system's warm-up call named before it starts; a system that gives no answer to a
call within --call-timeout seconds, or dies, ends the run with its name, the workload and the batch size.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import select
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from .. import tables
from ..stats import summarize
from ..tables import printable
from . import copied_engine, engine_failures_shown, json_out, labelled_dirs, token_outputs

VANILLA = "vanilla mini-sglang"


@dataclass
class Measured:
    """One system's results on one (workload, batch size): per repetition tok/s and the token ids it produced."""
    tok_per_s: list[float] = field(default_factory=list)
    tokens: list[list[list[int]]] = field(default_factory=list)  # repetition -> request -> ids


class MiniSgl:
    """mini-sglang in its own process (minisgl_worker). A build or a call that gives no answer in its time raises
    TimeoutError (the process is killed when the benchmark closes its systems)."""

    def __init__(self, model_dir: Path, build_timeout_s: float = 900.0, call_timeout_s: float = 300.0,
                 command: list[str] | None = None):
        command = command or [sys.executable, "-m", "seis.benchmarks.minisgl_worker", str(model_dir)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.build_timeout_s, self.call_timeout_s = build_timeout_s, call_timeout_s

    def wait_built(self) -> None:
        self.eos_token_ids = tuple(self._read(self.build_timeout_s, "its build")["eos_token_ids"])  # "ready"

    def _read(self, timeout_s: float, what: str) -> dict:
        # One line answers each request and nothing is sent unasked, so the pipe holds no read-ahead: select on it
        # is an honest "has the answer come".
        if not select.select([self.proc.stdout], [], [], timeout_s)[0]:
            raise TimeoutError(f"mini-sglang gave no answer to {what} within {timeout_s:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"mini-sglang exited (code {self.proc.wait()}); its log is on stderr")
        return json.loads(line)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_ids: tuple[int, ...] | None
                 ) -> list[list[int]]:
        if stop_ids and stop_ids != self.eos_token_ids:
            raise ValueError(f"mini-sglang stops only on its tokenizer's EOS {self.eos_token_ids}, not {stop_ids}")
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_new_tokens": max_new_tokens,
                                          "ignore_eos": stop_ids == ()}) + "\n")
        return self._read(self.call_timeout_s, f"a call of {len(prompts)} requests")["token_ids"]

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            self.proc.kill()
            self.proc.wait()


class SeisEngine:
    """An engine tree in its sandboxed process (EngineProcess)."""

    def __init__(self, engine_dir: Path, model_dir: Path, options: dict, cache_dir: Path,
                 call_timeout_s: float = 300.0):
        from ..engine_host import EngineProcess
        self.proc = EngineProcess(engine_dir, model_dir, options, timeout_s=900, cache_dir=cache_dir)
        self.call_timeout_s = call_timeout_s
        self.proc.start()  # from the main thread: the sandbox dies with the thread that started it
        self.build: dict = {}

    def wait_built(self) -> None:
        self.build = self.proc.build()

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_ids: tuple[int, ...] | None
                 ) -> list[list[int]]:
        """stop_ids None: the engine's own EOS ids; else exactly these (none: every request runs to the limit). Each
        output is what a request could have produced, or the engine's error (token_outputs): its tok/s counts them."""
        from ..engine_host.client import Sampling
        sampling = Sampling(max_new_tokens=max_new_tokens) if stop_ids is None else \
            Sampling(max_new_tokens=max_new_tokens, ignore_eos=True, stop_token_ids=stop_ids)
        reply = self.proc.generate(prompts, sampling, timeout_s=self.call_timeout_s)
        return token_outputs(self.proc, reply, max_new_tokens)

    def stats(self) -> dict:
        return self.proc.stats()

    def close(self) -> None:
        self.proc.close()


def wait_all_built(systems: dict) -> None:
    """Waits for every started system (label -> system) to finish building, all at once; raises the first
    failure once every build has ended."""
    t0 = time.perf_counter()

    def wait(label, system):
        system.wait_built()
        print(f"built {label} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max(1, len(systems))) as pool:
        futures = [pool.submit(wait, label, system) for label, system in systems.items()]
    for f in futures:
        f.result()


def parse_stacks(values: list[str], stack_label: str = "") -> list[tuple[str, list[str]]]:
    """(label, entries) of each --stack value, `[LABEL=]a,b,c`; the default label is "E0 + a + b + c".
    --stack-label names a single stack (the older spelling of LABEL=)."""
    if stack_label and len(values) != 1:
        raise SystemExit("--stack-label names a single --stack; with several, give each one as LABEL=a,b,c")
    stacks = []
    for value in values:
        label, _, names = value.rpartition("=")
        entries = [n for n in names.split(",") if n]
        if not entries:
            raise SystemExit(f"--stack wants [LABEL=]a,b,c, not {value!r}")
        stacks.append((stack_label or label or "E0 + " + " + ".join(entries), entries))
    return stacks


def engine_trees(stacks: list[tuple[str, list[str]]], engines: dict[str, Path], snapshots: list[str], store: Path,
                 work: Path) -> dict[str, Path]:
    """label -> engine tree: E0, each library stack on E0, --engine trees and stored snapshots. Each label names
    one system of the run (a row, a key of the JSON): none may be taken twice, nor be vanilla mini-sglang's, whose
    place in the run it would take (the baseline of every ratio). An --engine tree is copied into `work` first, so
    the run measures the tree it names in its JSON (`trees`), however the directory changes meanwhile."""
    from ..agents.offline.library import load_library
    from ..agents.offline.verify import build_candidate
    from ..engine_import import ENGINE_TEMPLATE
    out = {"E0": ENGINE_TEMPLATE}
    library = {t.name: t for t in load_library()} if stacks else {}
    for i, (label, stack) in enumerate(stacks):
        unknown = [n for n in stack if n not in library]
        if unknown:
            raise SystemExit(f"not in the library: {', '.join(unknown)} (known: {', '.join(sorted(library))})")
        if label in out or label == VANILLA:
            raise SystemExit(f"--stack {label}: label taken")
        out[label] = build_candidate(work / f"stack-{i}", [library[n] for n in stack])
    for i, (label, path) in enumerate(engines.items()):
        if label in out or label == VANILLA or not (path / "engine" / "__init__.py").is_file():
            raise SystemExit(f"--engine {label}={path}: label taken, or no engine package there")
        out[label] = copied_engine(label, path, work / f"engine-{i}")
    if snapshots:
        from ..store import SnapshotStore, StoreError
        if not store.is_dir():  # checked here: opening a store makes its folder
            raise SystemExit(f"snapshot store not found at {store}; pass --store DIR")
        st = SnapshotStore(store)
        for sid in snapshots:
            if f"snapshot {sid}" in out:
                raise SystemExit(f"--snapshot {sid}: given twice, or its label taken by an --engine")
            try:
                out[f"snapshot {sid}"] = st.get(sid, work / f"snapshot-{sid}")
            except (LookupError, StoreError) as e:  # unknown id, a refused or missing snapshot, DVC failing
                raise SystemExit(f"--snapshot {sid}: {printable(str(e))}") from None
    return out


def workloads(model_dir: Path, batches: list[int], reps: int, prompt_len: int, gsm8k: bool
              ) -> dict[tuple[str, int], list[list[list[int]]]]:
    """(workload, batch) -> calls (a warm-up, then one per repetition) -> prompts; no prompt is used twice."""
    import torch
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    out = {}
    for b in batches:
        out[("random", b)] = [[torch.randint(0, min(vocab, 20000), (prompt_len,), generator=gen).tolist()
                               for _ in range(b)] for _ in range(reps + 1)]
    if gsm8k:
        from ..prompts import encode_prompt, load_tokenizer
        from ..workloads import load_gsm8k_split
        from ..workloads.prepare import ensure_prepared
        tok = load_tokenizer(model_dir)
        items = iter(load_gsm8k_split("test", ensure_prepared()))
        need = sum(b * (reps + 1) for b in batches)
        if need > 660:
            raise SystemExit(f"the gsm8k workload needs {need} distinct test questions; the split has 660")
        for b in batches:
            out[("gsm8k", b)] = [[encode_prompt(tok, next(items).question, chat=bool(tok.chat_template))
                                  for _ in range(b)] for _ in range(reps + 1)]
    return out


def stop_ids(systems: dict, workload: str) -> tuple[int, ...] | None:
    """What ends a request: nothing on the random workload (forced length); on gsm8k vanilla mini-sglang's EOS ids
    for every system when it is in the run (it stops on its tokenizer's EOS only, a model's config may name more),
    else each engine's own (None)."""
    if workload == "random":
        return ()
    return systems[VANILLA].eos_token_ids if VANILLA in systems else None


def _call(systems: dict, name: str, prompts: list[list[int]], new_tokens: int, stop, where: str):
    try:
        return systems[name].generate(prompts, new_tokens, stop)
    except (TimeoutError, RuntimeError) as exc:  # a hung or dead system (EngineError too) ends the run, named
        raise SystemExit(f"{name} failed on {where}: {printable(str(exc))}") from exc  # it may quote an engine


def measure(systems: dict, calls: dict, new_tokens: int, reps: int) -> dict[tuple[str, int], dict[str, Measured]]:
    results: dict[tuple[str, int], dict[str, Measured]] = {}
    names = list(systems)
    for (workload, b), batches in calls.items():
        stop = stop_ids(systems, workload)
        got = {n: Measured() for n in names}
        for name in names:  # warm-up: kernels compiled, graphs of this batch size captured, memory grown
            print(f"{workload} at batch {b}: warming up {name}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            _call(systems, name, batches[0], new_tokens, stop, f"{workload} at batch {b}")
            print(f"{workload} at batch {b}: {name} warmed up in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)  # first calls compile: where a run's time limit goes
        for rep, prompts in enumerate(batches[1:]):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                outs = _call(systems, name, prompts, new_tokens, stop, f"{workload} at batch {b}")
                wall = time.perf_counter() - t0
                if len(outs) != len(prompts) or (stop == () and any(len(o) != new_tokens for o in outs)):
                    raise SystemExit(f"{name} returned {[len(o) for o in outs]} tokens for {len(prompts)} requests "
                                     f"({workload}, batch {b})")
                got[name].tok_per_s.append(sum(len(o) for o in outs) / wall)
                got[name].tokens.append(outs)
        results[(workload, b)] = got
        medians = ", ".join(f"{name} {summarize(m.tok_per_s)['median']:,.0f}" for name, m in got.items())
        print(f"{workload} at batch {b} done (median tok/s: {medians})", file=sys.stderr, flush=True)
    return results


def _tokens(measured) -> int:
    return sum(len(o) for rep in measured.tokens for o in rep)


def _prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def summary(results: dict, baseline: str) -> dict:
    """JSON-ready: per (workload, batch) and system, tok/s and the paired ratio to the baseline, the tokens it
    generated (and their ratio to the baseline's: at natural length, a system that stops late makes more tokens per
    second of the same work), and how far its greedy tokens agree with E0's (the shortest common prefix)."""
    out = {}
    for (workload, b), got in results.items():
        base, e0 = got[baseline], got["E0"]
        base_tokens = _tokens(base)
        out[f"{workload}@{b}"] = {name: {
            "tok_per_s": summarize(m.tok_per_s),
            "vs_baseline": summarize([x / y for x, y in zip(m.tok_per_s, base.tok_per_s)]),
            "generated_tokens": _tokens(m),
            "tokens_vs_baseline": round(_tokens(m) / base_tokens, 4) if base_tokens else None,
            "min_prefix_equal_to_e0": min(_prefix(x, y) for r1, r2 in zip(m.tokens, e0.tokens)
                                          for x, y in zip(r1, r2)),
        } for name, m in got.items()}
    return out


def render(result: dict) -> str:
    lines = [f"{result['device']}, {result['model']} ({result['weights']}), commit {result['commit']}, "
             f"median (min–max) of {result['reps']} repetitions; ratios against {result['baseline']}, same run:"]
    if trees := result.get("trees"):
        lines.append("engine trees: " + ", ".join(f"{label} {digest[:12]}" for label, digest in trees.items()))
    for workload in ("random", "gsm8k"):
        keys = [k for k in result["results"] if k.startswith(workload + "@")]
        if not keys:
            continue
        what = (f"{result['prompt_len']}-token random prompts, {result['new_tokens']} forced new tokens"
                if workload == "random" else f"GSM8K test questions, greedy, at most {result['new_tokens']} new tokens, "
                                             f"stopping at {_stops(result)}")
        header = ["tok/s", *[f"batch {k.split('@')[1]}" for k in keys]]
        rows = []
        for name in result["systems"]:
            cells = []
            for k in keys:
                r = result["results"][k][name]
                t, v = r["tok_per_s"], r["vs_baseline"]
                cells.append(f"{t['median']:,.0f} ({t['min']:,.0f}–{t['max']:,.0f}) {v['median']:.2f}x"
                             + _length_note(r.get("tokens_vs_baseline")))
            rows.append([name, *cells])
        lines += ["", f"{workload}: {what}", tables.markdown(header, rows)]
    return "\n".join(lines)


LENGTH_TOLERANCE = 0.05   # of generated tokens against the baseline's, before a cell says so


def _length_note(ratio: float | None) -> str:
    """A cell whose system generated more or fewer tokens than the baseline (at natural length: stopping elsewhere)
    says by how much: its tok/s is then over different work."""
    if ratio is None or abs(ratio - 1) <= LENGTH_TOLERANCE:
        return ""
    return f" (tokens {100 * (ratio - 1):+.0f} %)"


def _stops(result: dict) -> str:
    ids = result.get("gsm8k_stop_ids")
    if ids is None:
        return "each engine's EOS ids"
    return f"{VANILLA}'s EOS ids ({', '.join(map(str, ids))}) for every system" if ids else "no EOS (none known)"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b-random")
    ap.add_argument("--stack", action="append", default=[], metavar="[LABEL=]A,B,C",
                    help="library transformations stacked on E0, comma-separated; repeatable")
    ap.add_argument("--stack-label", default="", help="the name of a single --stack in the table (default: "
                                                      "E0 + the entries)")
    ap.add_argument("--engine", action="append", default=[], metavar="LABEL=DIR", help="an engine tree; repeatable")
    ap.add_argument("--snapshot", action="append", default=[], help="a stored snapshot id; repeatable")
    ap.add_argument("--store", type=Path, default=Path("store"))
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-gsm8k", action="store_true", help="only the random-prompt workload")
    ap.add_argument("--minisgl", choices=("auto", "on", "off"), default="auto",
                    help="vanilla mini-sglang: when importable (auto), required (on), or left out (off)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--call-timeout", type=float, default=300.0,
                    help="seconds one batch call of a system may take (warm-up included) before the run stops")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    json_out(args.json)
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        raise SystemExit(f"--batches wants batch sizes separated by commas (e.g. 1,8,32), not {args.batches!r}") \
            from None
    if not batches or min(batches) < 1 or args.reps < 3:
        raise SystemExit("--batches needs positive sizes, and --reps at least 3 (median of three or more)")
    if args.prompt_len < 1 or args.new_tokens < 1 or not args.call_timeout > 0:  # not an engine's failure later
        raise SystemExit("--prompt-len and --new-tokens need at least 1, and --call-timeout a positive number of "
                         "seconds")
    available = importlib.util.find_spec("minisgl") is not None
    if args.minisgl == "on" and not available:
        raise SystemExit("--minisgl on: the `minisgl` package (sgl-project/mini-sglang) is not importable here")
    with_vanilla = available and args.minisgl != "off"

    from ..engine_host.jit_cache import held_cache, private_cache
    from ..models import resolve_model
    from ..workspace.tree import scratch_dir, tree_hash
    from ..provenance import device_label, source_commit, weights_label

    from ..models import ModelError
    try:
        model_dir = Path(resolve_model(args.model))
    except ModelError as e:
        raise SystemExit(f"--model: {e}") from None
    stacks = parse_stacks(args.stack, args.stack_label)
    labelled = labelled_dirs(args.engine)
    calls = workloads(model_dir, batches, args.reps, args.prompt_len, not args.no_gsm8k)
    options = {"device": args.device, "max_batch_size": max(batches), "max_seq_len": 2048}
    systems: dict = {}
    # engines write their caches under tmp; an engine's failure ends the run with its message made printable
    with scratch_dir("seis-versus-") as tmp, ExitStack() as held, engine_failures_shown():
        trees = engine_trees(stacks, labelled, args.snapshot, args.store, tmp)
        hashes = {label: tree_hash(tree) for label, tree in trees.items()}  # what each row measured
        shared = held.enter_context(held_cache(hashes["E0"], tmp / "cache-E0"))
        # each candidate's cache is a copy of E0's as it stands before anything builds (E0 writes into its own)
        caches = {label: shared if label == "E0" else private_cache(tmp / f"cache-{i}", shared)
                  for i, label in enumerate(trees)}
        try:
            if with_vanilla:
                systems[VANILLA] = MiniSgl(model_dir, call_timeout_s=args.call_timeout)
            for label, tree in trees.items():
                systems[label] = SeisEngine(tree, model_dir, options, caches[label], args.call_timeout)
            wait_all_built(systems)
            results = measure(systems, calls, args.new_tokens, args.reps)
            gsm8k_stop = stop_ids(systems, "gsm8k")
            stats = {n: s.stats() for n, s in systems.items() if isinstance(s, SeisEngine)}
        finally:
            for s in systems.values():
                s.close()
    baseline = VANILLA if with_vanilla else "E0"
    result = {"benchmark": "versus", "model": args.model,
              "weights": weights_label(args.model), "device": device_label(args.device),
              "commit": source_commit(), "reps": args.reps, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
              "baseline": baseline, "systems": list(systems), "trees": hashes, "results": summary(results, baseline),
              "gsm8k_stop_ids": None if gsm8k_stop is None else list(gsm8k_stop),
              "engine_stats": stats}
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
