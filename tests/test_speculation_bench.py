"""seis.benchmarks.speculation on tiny-qwen3 (CPU, float32, seconds): the ngram-speculation entry applied onto E0
runs over GSM8K and retrieval prompts, its counters add up, and every request's greedy tokens are E0's."""
from __future__ import annotations

import json

from seis.benchmarks import speculation


def test_speculation_benchmark_counters_and_greedy_tokens(prepared_dir, tmp_path, capsys):
    out = tmp_path / "speculation.json"
    result = speculation.main(["--model", "tiny-qwen3", "--gsm8k", "2", "--retrieval", "1", "--max-new-tokens", "64",
                               "--check", "3", "--json", str(out)])
    assert json.loads(out.read_text())["runs"][0]["workloads"].keys() == {"gsm8k", "retrieval"}
    run = result["runs"][0]
    requests = run["requests"]
    assert [r["workload"] for r in requests] == ["gsm8k", "gsm8k", "retrieval"]
    for r in requests:
        assert r["equal_to_e0"] is True, f"{r['id']}: speculation changed the greedy tokens"
        assert r["generated_tokens"] == len(r["token_ids"]) <= 64
        assert 0 <= r["accepted_draft_tokens"] <= r["draft_tokens"] <= 7 * r["verify_steps"]
        assert r["verify_steps"] <= r["decode_steps"]
        if r["verify_steps"]:
            assert 1 <= r["tokens_per_verify_step"] <= 8
        else:
            assert r["tokens_per_verify_step"] is None and r["draft_tokens"] == 0
    # tiny-qwen3's greedy answer to the shortest retrieval item repeats its context: at least one draft is verified
    assert sum(r["verify_steps"] for r in requests) >= 1, "no draft on tiny-qwen3: the counters went unexercised"
    for name, s in run["workloads"].items():
        rs = [r for r in requests if r["workload"] == name]
        assert s["requests"] == len(rs) and s["checked_against_e0"] == s["equal_to_e0"] == len(rs)
        for k in speculation.COUNTERS:
            assert s[k] == sum(r[k] for r in rs)
        assert s["accepted_draft_tokens"] <= s["draft_tokens"]
        if s["verify_steps"]:
            assert s["tokens_per_verify_step"] >= 1 and 0 <= s["acceptance_rate"] <= 1
            p = s["per_request_tokens_per_verify_step"]
            assert 1 <= p["min"] <= p["median"] <= p["max"] and p["min"] <= p["mean"] <= p["max"]
    printed = capsys.readouterr().out
    assert "| tiny-qwen3 | gsm8k" in printed and "| tiny-qwen3 | retrieval" in printed
    assert "equal to E0's on 3 of 3 checked requests" in printed
