"""Child-process side: host one engine, answer one JSON request per line. Runs inside the sandbox as a plain
script next to engine_import.py (the only SEIS files the sandbox shows):

    python /seis-host/worker.py --engine-dir /engine --model-dir /model --options JSON

Every request carries an `id`; the reply echoes it. The engine runs in this process and could write to the
protocol stream itself, so the id is what lets the parent tell a reply to the current request from anything
else (the parent's nonces are unpredictable, so no reply can be written ahead of its request).
Anything the engine prints goes to stderr, so stray prints cannot corrupt replies.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from dataclasses import asdict


def _reply(out, **payload) -> None:
    out.write(json.dumps(payload) + "\n")
    out.flush()


def serve(engine_dir: str, model_dir: str, options: dict) -> None:
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints from the engine land in stderr

    from engine_import import import_engine  # this script's sibling

    engine = None
    for line in sys.stdin:
        if not line.strip():
            continue
        rid = None
        try:
            msg = json.loads(line)
            rid = msg.pop("id", None)
            op = msg.pop("op")
            if op == "shutdown":
                _reply(protocol, id=rid, ok=True, result=None)
                return
            if op == "build":
                mod = import_engine(engine_dir)
                engine = mod.Engine(model_dir, mod.EngineOptions.from_dict(options)).build()
                result = {"eos_token_ids": list(engine.eos_token_ids), "stats": engine.stats()}
            elif engine is None:
                raise RuntimeError(f"'{op}' before 'build'")
            elif op == "generate":
                params = [mod.SamplingParams(**{**p, "stop_token_ids": tuple(p.get("stop_token_ids", ()))})
                          for p in msg["sampling"]]
                result = [asdict(g) for g in engine.generate(msg["prompts"], params)]
            elif op in ("score", "verify"):
                fn = engine.score if op == "score" else engine.verify
                result = [asdict(s) for s in fn(msg["prompts"], msg["continuations"], top_k=msg.get("top_k", 5))]
            elif op == "stats":
                result = engine.stats()
            else:
                raise ValueError(f"unknown op {op!r}")
            _reply(protocol, id=rid, ok=True, result=result)
        except Exception as e:  # the engine's error goes back to the caller; the worker keeps serving
            _reply(protocol, id=rid, ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-dir", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--options", default="{}")
    args = ap.parse_args()
    serve(args.engine_dir, args.model_dir, json.loads(args.options))


if __name__ == "__main__":
    main()
