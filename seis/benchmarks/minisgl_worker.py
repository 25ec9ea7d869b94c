"""Vanilla mini-sglang (the definition of "vanilla" here) behind a JSON-lines pipe, for the side-by-side benchmark.

    python -m seis.benchmarks.minisgl_worker MODEL_DIR [MEMORY_RATIO]   # then one request per line on stdin:
    {"prompts": [[ids...], ...], "max_new_tokens": 256, "ignore_eos": true}  ->  {"token_ids": [[...], ...]}

It runs mini-sglang through its own offline Python API, as a user would (`minisgl.llm.LLM`, FlashInfer attention,
CUDA graphs up to batch 64; its KV pool takes MEMORY_RATIO of the GPU, default 0.3, so the engines it is compared
with fit beside it: the pool's size does not change its speed at these batch sizes). Trusted public code: it is not sandboxed. Its own logs go to stderr; the protocol
has stdout to itself.
"""
from __future__ import annotations

import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever mini-sglang prints lands on stderr
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    ratio = float(argv[1]) if len(argv) > 1 else 0.3
    llm = LLM(argv[0], attention_backend="fi", cuda_graph_max_bs=64, memory_ratio=ratio)
    eos = llm.eos_token_id  # one id (its tokenizer's; None: it never stops early), compared with each new token
    protocol.write(json.dumps({"ready": True, "eos_token_ids": [] if eos is None else [eos]}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        params = SamplingParams(temperature=0.0, max_tokens=req["max_new_tokens"], ignore_eos=req["ignore_eos"])
        outs = llm.generate(req["prompts"], params)
        ids = [with_eos(o["token_ids"], req["max_new_tokens"], eos) for o in outs]
        protocol.write(json.dumps({"token_ids": ids}) + "\n")
    return 0


def with_eos(ids: list[int], max_new_tokens: int, eos: int) -> list[int]:
    """mini-sglang leaves a request's last token out of its output when that token is EOS, whether the request
    stopped on it or reached its limit with it (EOS ignored); SEIS engines keep it. A request is short of its
    limit only then, so the EOS is put back: every system counts the tokens it decoded."""
    return ids + [eos] if len(ids) < max_new_tokens else ids


if __name__ == "__main__":
    sys.exit(main())
