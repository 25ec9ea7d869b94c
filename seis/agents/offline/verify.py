"""Check library transformations against E0: apply them to a copy of E0, run both engines in child processes
(the contract, as the evaluator does) and compare greedy tokens, seeded samples and teacher-forced log-probs.

    python -m seis.agents.offline.verify [--model tiny-qwen3] [--device cpu] [--names a,b] [--out DIR]

Prints one JSON object: per candidate ("<name>" alone and "all" in sequence), whether each output matched.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...engine_import import ENGINE_TEMPLATE
from ...workspace import copy_tree
from .library import Transformation, load_library
from .merge import apply_transformation, with_prerequisites

PROMPTS = [[5, 17, 33, 100, 7], [9] * 13, list(range(3, 40)), [200], list(range(50, 71)), [11, 12]]


def build_candidate(dest: Path, transformations: list[Transformation], base_dir: Path = ENGINE_TEMPLATE) -> Path:
    """E0 copied to dest with the transformations applied in order; raises if one does not apply."""
    copy_tree(base_dir, dest)
    for t in transformations:
        result = apply_transformation(dest, base_dir, t)
        if result.outcome != "applied":
            raise RuntimeError(f"{t.name} did not apply onto {dest}: {result.outcome} {result.detail}")
    return dest


def run_engine(engine_dir: Path, model_dir: Path, device: str, new_tokens: int = 16) -> dict:
    """Everything compared, from one engine in its own process."""
    from ...engine_host import EngineProcess
    from ...engine_host.client import Sampling

    options = {"device": device, "max_batch_size": 4, "max_seq_len": 256, "page_size": 4}
    greedy = Sampling(max_new_tokens=new_tokens, ignore_eos=True)
    sampled = [Sampling(max_new_tokens=new_tokens, temperature=0.8, top_k=20, top_p=0.9, seed=i, ignore_eos=True)
               for i in range(len(PROMPTS))]
    with EngineProcess(engine_dir, model_dir, options, timeout_s=300,
                       env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}) as eng:
        eng.build()
        out = {"greedy": [g["token_ids"] for g in eng.generate(PROMPTS, greedy)],
               "sampled": [g["token_ids"] for g in eng.generate(PROMPTS, sampled)]}
        conts = out["greedy"]
        # Natural lengths: EOS, a stop id taken from the greedy outputs, max_new_tokens; more requests than slots.
        stop = Sampling(max_new_tokens=3 * new_tokens, stop_token_ids=(conts[0][new_tokens // 2],))
        out["natural"] = [(g["token_ids"], g["finish_reason"]) for g in
                          eng.generate(PROMPTS * 2, [Sampling(max_new_tokens=3 * new_tokens), stop] * len(PROMPTS))]
        out["score"] = eng.score(PROMPTS, conts, top_k=5)
        out["verify"] = eng.verify([p + c[:1] for p, c in zip(PROMPTS, conts)], [c[1:6] for c in conts], top_k=5)
    return out


def _max_abs(a: list[dict], b: list[dict], key: str) -> float:
    diffs = [abs(x - y) for sa, sb in zip(a, b) for ra, rb in zip(sa[key], sb[key])
             for x, y in (zip(ra, rb) if isinstance(ra, list) else [(ra, rb)])]
    return max(diffs, default=0.0)


def compare(ref: dict, cand: dict) -> dict:
    return {
        "greedy_equal": ref["greedy"] == cand["greedy"] and ref["natural"] == cand["natural"],
        "sampled_equal": ref["sampled"] == cand["sampled"],
        "score_top_ids_equal": [s["top_ids"] for s in ref["score"]] == [s["top_ids"] for s in cand["score"]],
        "score_max_abs_diff": _max_abs(ref["score"], cand["score"], "token_logprobs"),
        "verify_max_abs_diff": _max_abs(ref["verify"], cand["verify"], "token_logprobs"),
    }


def verify(model: str = "tiny-qwen3", device: str = "cpu", names: list[str] | None = None,
           work_dir: Path | None = None, include_all: bool = True) -> dict:
    from ...models import resolve_model

    library = {t.name: t for t in load_library()}
    chosen = [library[n] for n in (names or sorted(library))]
    model_dir = resolve_model(model)
    with tempfile.TemporaryDirectory(prefix="seis-verify-") as tmp:
        root = Path(work_dir or tmp)
        # each on E0 with its prerequisites; "all": in sequence (each after its prerequisites), less what another
        # chosen one supersedes
        candidates = {t.name: with_prerequisites(t) for t in chosen}
        if include_all and len(chosen) > 1:
            superseded = {s for t in chosen for s in t.supersedes}
            stack: list[Transformation] = []
            for t in chosen:
                if t.name not in superseded:
                    stack += [x for x in with_prerequisites(t) if x not in stack]
            candidates["all"] = stack
        dirs = {name: build_candidate(root / name, ts) for name, ts in candidates.items()}
        dirs["E0"] = ENGINE_TEMPLATE
        with ThreadPoolExecutor(max_workers=len(dirs)) as pool:
            futures = {name: pool.submit(run_engine, d, model_dir, device) for name, d in dirs.items()}
            results = {name: f.result() for name, f in futures.items()}
    ref = results.pop("E0")
    return {"model": model, "device": device, "candidates": {n: compare(ref, r) for n, r in results.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--names", default="", help="comma-separated transformation names (default: all)")
    args = ap.parse_args()
    names = [n for n in args.names.split(",") if n] or None
    print(json.dumps(verify(args.model, args.device, names), indent=2))


if __name__ == "__main__":
    main()
