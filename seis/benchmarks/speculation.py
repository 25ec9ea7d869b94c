"""How often n-gram speculation's drafts hold on real text: the `ngram-speculation` library entry applied onto E0
(with its prerequisites, as the offline agent applies it), greedy generation with the chat template over GSM8K test
prompts and retrieval items, one request at a time; per workload, the drafted and accepted tokens and the tokens
each verify step yields.

    python -m seis.benchmarks.speculation --model smollm2-135m-instruct --gsm8k 30 --retrieval 9
                                          [--max-new-tokens 256] [--check 3] [--compare qwen3-0.6b-random]
                                          [--compare-gsm8k 4] [--compare-retrieval 0] [--json F]

Counters are the engine's own (`Engine.stats()`: verify_steps, draft_tokens, accepted_draft_tokens, decode_steps,
generated_tokens), read before and after each request. Tokens per verify step is 1 + accepted / verify steps
(seis.benchmarks.ladder's formula: each verify step yields its accepted draft tokens plus one of its own); a
request with no verify step (nothing in its context recurred) has no such figure and is counted apart. Tokens per
decode step divides the tokens after the prefill's by every decode step, drafting or not. Greedy tokens must not
change: the first --check items of each workload also run on E0 and their tokens and finish reasons are compared.
--compare runs the same for another model (random weights, say) on the first items only. The requests run at
batch 1 (a lone request may draft 7 tokens; batched requests share 8 rows) and EOS ends them (natural length);
prompts longer than the context less --max-new-tokens keep their end, as the gate's do. On a 2-core CPU, SmolLM2
takes about 23 s per GSM8K request at 256 new tokens (docs/benchmarks.md, "Speculation on real text").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .. import tables
from ..provenance import source_commit
from . import json_out
from .ladder import _drafts

ENTRY = "ngram-speculation"
COUNTERS = ("generated_tokens", "decode_steps", "verify_steps", "draft_tokens", "accepted_draft_tokens")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def speculating_engine(dest: Path) -> Path:
    """E0 copied to dest with ngram-speculation and its prerequisites applied (seis.agents.offline.verify)."""
    from ..agents.offline.library import load_library
    from ..agents.offline.merge import with_prerequisites
    from ..agents.offline.verify import build_candidate
    entry = next(t for t in load_library() if t.name == ENTRY)
    return build_candidate(dest, with_prerequisites(entry))


def workload_prompts(model_dir: Path, n_gsm8k: int, n_retrieval: int, cap: int) -> dict[str, list[dict]]:
    """workload -> [{id, prompt ids, truncated}]: GSM8K test items in file order, retrieval items covering every
    length bucket (seis.postval.accuracy.retrieval_subset), chat-templated with the model's tokenizer."""
    from ..postval.accuracy import gsm8k_prompts, retrieval_prompts, retrieval_subset
    from ..prompts import load_tokenizer
    from ..workloads import ensure_prepared, load_gsm8k_split, load_retrieval

    root = ensure_prepared()
    tok = load_tokenizer(model_dir)
    tok.model_max_length = sys.maxsize  # we truncate ourselves
    out = {}
    for name, items, encode in (
            ("gsm8k", load_gsm8k_split("test", root)[:n_gsm8k] if n_gsm8k else [], gsm8k_prompts),
            ("retrieval", retrieval_subset(load_retrieval(root), n_retrieval) if n_retrieval else [],
             retrieval_prompts)):
        if items:
            out[name] = [{"workload": name, "id": it.id, "prompt": p[-cap:], "truncated": len(p) > cap}
                         for it, p in zip(items, encode(tok, items))]
    return out


def _generate(engine_dir: Path, model_dir: Path, options: dict, threads: int, jobs: list[dict],
              max_new_tokens: int, label: str) -> list[dict]:
    """Each job alone (batch 1), greedy, EOS on; per request its tokens, finish reason, wall time and the change
    in the engine's counters."""
    from ..engine_host import EngineProcess
    from ..engine_host.client import Sampling

    sampling = Sampling(max_new_tokens=max_new_tokens)
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out = []
    with EngineProcess(engine_dir, model_dir, options, timeout_s=1800, env=env) as eng:
        eng.build()
        before = eng.stats()
        t_start = time.perf_counter()
        for i, job in enumerate(jobs, 1):
            t0 = time.perf_counter()
            g = eng.generate([job["prompt"]], sampling)[0]
            dt = time.perf_counter() - t0
            after = eng.stats()
            out.append({"token_ids": g["token_ids"], "finish_reason": g["finish_reason"], "seconds": dt,
                        **{k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}})
            before = after
            if i % 10 == 0 or i == len(jobs):
                print(f"  {label}: {i}/{len(jobs)} requests, {time.perf_counter() - t_start:.0f} s", file=sys.stderr,
                      flush=True)
    return out


def tokens_per_verify_step(r: dict) -> float | None:
    return 1 + r["accepted_draft_tokens"] / r["verify_steps"] if r["verify_steps"] else None


def summarize_workload(requests: list[dict]) -> dict:
    tot = {k: sum(r[k] for r in requests) for k in COUNTERS}
    per = [x for x in map(tokens_per_verify_step, requests) if x is not None]
    return {
        "requests": len(requests),
        "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in requests),
        "truncated_prompts": sum(r["truncated"] for r in requests),
        **tot,
        "acceptance_rate": tot["accepted_draft_tokens"] / tot["draft_tokens"] if tot["draft_tokens"] else None,
        "tokens_per_verify_step": tokens_per_verify_step(tot),
        # every decode step, drafting or not (the prefill's token aside); the steps a multistep chunk runs past a
        # request's EOS count too (at most 7 per request), as the engine ran them
        "tokens_per_decode_step": ((tot["generated_tokens"] - len(requests)) / tot["decode_steps"]
                                   if tot["decode_steps"] else None),
        # share of the output that came out of accepted drafts (the tokens a step got for free)
        "accepted_share_of_output": (tot["accepted_draft_tokens"] / tot["generated_tokens"]
                                     if tot["generated_tokens"] else None),
        "per_request_tokens_per_verify_step": ({"mean": statistics.mean(per), "median": statistics.median(per),
                                                "min": min(per), "max": max(per), "n": len(per)} if per else None),
        "requests_without_verify_step": len(requests) - len(per),
        "seconds": sum(r["seconds"] for r in requests),
    }


def measure(model: str, n_gsm8k: int, n_retrieval: int, max_new_tokens: int, check: int, threads: int,
            work: Path, device: str = "cpu") -> dict:
    """The speculating engine over the chosen items of model, and E0 over the first `check` items of each."""
    from ..engine_import import ENGINE_TEMPLATE
    from ..models import resolve_model
    from ..models.model_config import read_model_config

    model_dir = Path(resolve_model(model))
    context = read_model_config(model_dir).max_position_embeddings
    if max_new_tokens >= context - 1:
        raise SystemExit(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in {model}'s "
                         f"{context}-position context")
    workloads = workload_prompts(model_dir, n_gsm8k, n_retrieval, context - max_new_tokens)
    jobs = [job for js in workloads.values() for job in js]
    if not jobs:
        raise SystemExit("no items chosen: pass --gsm8k N and/or --retrieval M")
    max_seq_len = min(context, max(len(j["prompt"]) for j in jobs) + max_new_tokens)
    # max_batch_size 8: a verify step has min(8, max_batch_size) rows, so a lone request drafts up to 7 tokens
    options = {"device": device, "max_batch_size": 8, "max_seq_len": max_seq_len, "kv_cache_tokens": max_seq_len}
    engine_dir = speculating_engine(Path(tempfile.mkdtemp(prefix="speculating-", dir=work)) / "engine")
    t0 = time.perf_counter()
    speculative = _generate(engine_dir, model_dir, options, threads, jobs, max_new_tokens, f"{model} + {ENTRY}")
    speculative_s = time.perf_counter() - t0
    checked = [i for i, j in enumerate(jobs) if workloads[j["workload"]].index(j) < check]  # first items of each
    t0 = time.perf_counter()
    e0 = (_generate(ENGINE_TEMPLATE, model_dir, options, threads, [jobs[i] for i in checked], max_new_tokens,
                    f"{model} E0 (check)") if checked else [])
    e0_s = time.perf_counter() - t0
    same = {i: (speculative[i]["token_ids"], speculative[i]["finish_reason"]) == (r["token_ids"], r["finish_reason"])
            for i, r in zip(checked, e0)}
    requests = [{"workload": j["workload"], "id": j["id"], "prompt_tokens": len(j["prompt"]),
                 "truncated": j["truncated"], **r, "tokens_per_verify_step": tokens_per_verify_step(r),
                 "equal_to_e0": same.get(i)} for i, (j, r) in enumerate(zip(jobs, speculative))]
    per_workload = {}
    for w in workloads:
        rs = [r for r in requests if r["workload"] == w]
        checks = [r["equal_to_e0"] for r in rs if r["equal_to_e0"] is not None]
        per_workload[w] = {**summarize_workload(rs), "checked_against_e0": len(checks),
                           "equal_to_e0": sum(checks)}
    return {"model": model, "engine_options": options, "speculating_seconds": speculative_s,
            "e0_check_seconds": e0_s, "workloads": per_workload, "requests": requests}


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def markdown_table(results: list[dict]) -> str:
    header = ["model", "workload", "requests", "generated tokens", "verify steps", "drafted", "accepted",
              "acceptance", "tokens per verify step", "per request: mean", "per request: median (min–max)",
              "tokens per decode step (all)", "same tokens as E0"]
    rows = []
    for res in results:
        for w, s in res["workloads"].items():
            p = s["per_request_tokens_per_verify_step"]
            no_step = s["requests_without_verify_step"]
            cut = f" ({s['truncated_prompts']} of {s['requests']} prompts cut)" if s["truncated_prompts"] else ""
            rows.append([
                res["model"], w + cut,
                str(s["requests"]), f"{s['generated_tokens']:,}", f"{s['verify_steps']:,}",
                f"{s['draft_tokens']:,}", f"{s['accepted_draft_tokens']:,}",
                "–" if s["acceptance_rate"] is None else f"{100 * s['acceptance_rate']:.1f} %",
                _f(s["tokens_per_verify_step"]),
                "–" if p is None else _f(p["mean"]) + (f" ({no_step} without a step)" if no_step else ""),
                "–" if p is None else f"{_f(p['median'])} ({_f(p['min'])}–{_f(p['max'])})",
                _f(s["tokens_per_decode_step"]),
                f"{s['equal_to_e0']} of {s['checked_against_e0']}" if s["checked_against_e0"] else "not checked"])
    return tables.markdown(header, rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--gsm8k", type=int, default=30, help="GSM8K test prompts (the first N of the test split)")
    ap.add_argument("--retrieval", type=int, default=9, help="retrieval items, spread over the length buckets")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--check", type=int, default=3, help="the first N items of each workload also run on E0")
    ap.add_argument("--compare", default="", help="also measure this model (e.g. qwen3-0.6b-random)")
    ap.add_argument("--compare-gsm8k", type=int, default=4)
    ap.add_argument("--compare-retrieval", type=int, default=0)
    ap.add_argument("--compare-check", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of each engine process")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    json_out(args.json)
    if min(args.gsm8k, args.retrieval, args.check, args.compare_gsm8k, args.compare_retrieval, args.compare_check) < 0:
        raise SystemExit("counts must not be negative")
    if args.max_new_tokens < 1 or args.threads < 1:
        raise SystemExit("--max-new-tokens and --threads must be at least 1")

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="seis-speculation-") as tmp:
        runs = [measure(args.model, args.gsm8k, args.retrieval, args.max_new_tokens, args.check, args.threads,
                        Path(tmp), args.device)]
        if args.compare:
            runs.append(measure(args.compare, args.compare_gsm8k, args.compare_retrieval, args.max_new_tokens,
                                args.compare_check, args.threads, Path(tmp), args.device))
    device = cpu_name() if args.device == "cpu" else args.device
    result = {"benchmark": "speculation", "entry": ENTRY, "commit": source_commit(), "device": device,
              "threads": args.threads, "max_new_tokens": args.max_new_tokens, "seconds": time.perf_counter() - t0,
              "argv": sys.argv[1:] if argv is None else argv, "runs": runs}
    table = markdown_table(runs)
    result["table"] = table
    checked = sum(s["checked_against_e0"] for r in runs for s in r["workloads"].values())
    equal = sum(s["equal_to_e0"] for r in runs for s in r["workloads"].values())
    result.update(checked_against_e0=checked, equal_to_e0=equal)
    print(f"{device} ({args.threads} thread(s)), greedy, chat template, batch 1, at most {args.max_new_tokens} new "
          f"tokens (EOS on), {ENTRY} on E0, commit {result['commit']}, {result['seconds']:.0f} s:")
    for r in runs:
        for w, s in r["workloads"].items():
            print(f"  {r['model']} {w}: {s['requests']} requests, {s['generated_tokens']} tokens"
                  f"{_drafts(s) or '  drafts: none'}")
    print(table)
    if checked:
        print(f"greedy tokens and finish reasons equal to E0's on {equal} of {checked} checked requests"
              + ("" if equal == checked else "  <-- SPECULATION CHANGED GREEDY OUTPUTS"))
    else:
        print("greedy outputs not checked against E0 (--check 0)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    out = main()
    sys.exit(0 if out["equal_to_e0"] == out["checked_against_e0"] else 1)  # speculation changed greedy outputs
