"""E0 against Hugging Face transformers on CPU (float32): tokens, logits, scoring, batching, errors."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from seis.models import resolve_model

NEW = 24


def _hf(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _hf_greedy(hf, prompt, n=NEW):
    """Plain argmax decoding with HF's KV cache (generate() would suppress EOS under min_new_tokens)."""
    out, past, ids = [], None, torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(n):
            step = hf(input_ids=ids, past_key_values=past, use_cache=True)
            past = step.past_key_values
            out.append(int(step.logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


def _hf_logits(hf, ids):
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()


class Setup:
    def __init__(self, E, name, prompts, page_size=4):
        self.model_dir = resolve_model(name)
        self.hf = _hf(self.model_dir)
        self.engine = E.Engine(self.model_dir, E.EngineOptions(device="cpu", max_batch_size=4, max_seq_len=256,
                                                              page_size=page_size)).build()
        self.prompts = prompts


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-llama"])
def tiny(request, E):
    prompts = [[5, 17, 33, 100, 7], [9] * 13, list(range(3, 40)), [200]]
    return Setup(E, request.param, prompts)


@pytest.fixture(scope="module")
def smollm2(E):
    from seis.prompts import encode_prompt, load_tokenizer
    model_dir = resolve_model("smollm2-135m-instruct")
    tok = load_tokenizer(model_dir)
    texts = ["What is 2+3?", "Name a color of the sky.", "Write one word: hello"]
    prompts = [encode_prompt(tok, t, chat=True) for t in texts] + [tok("The capital of France is")["input_ids"]]
    return Setup(E, "smollm2-135m-instruct", prompts, page_size=16)


def _check_greedy_matches_hf(setup, E):
    outs = setup.engine.generate(setup.prompts, E.SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    for prompt, out in zip(setup.prompts, outs):
        assert out.token_ids == _hf_greedy(setup.hf, prompt)
        assert out.finish_reason == "length"


def test_greedy_tokens_identical_to_hf(tiny, E):
    _check_greedy_matches_hf(tiny, E)


@pytest.mark.slow
def test_smollm2_greedy_tokens_identical_to_hf(smollm2, E):
    _check_greedy_matches_hf(smollm2, E)


@pytest.mark.slow
def test_smollm2_answers_in_english_and_stops_at_eos(smollm2, E):
    from seis.prompts import load_tokenizer
    out = smollm2.engine.generate([smollm2.prompts[0]], E.SamplingParams(max_new_tokens=64))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in smollm2.engine.eos_token_ids
    assert "5" in load_tokenizer(smollm2.model_dir).decode(out.token_ids, skip_special_tokens=True)


def test_fp32_logits_within_1e4_relative(tiny, E):
    """Every row of the prefill logits (not just the last) against HF's forward."""
    eng, ids = tiny.engine, tiny.prompts[2]
    r = eng._new_request(0, ids, E.SamplingParams())
    eng._admit(r, len(ids))
    try:
        ours = eng._forward(eng._extend_batch([(r, ids, 0)], all_rows=True))
    finally:
        eng._release(r)
    ref = _hf_logits(tiny.hf, ids)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_score_equals_reference_log_softmax(tiny):
    prompt, cont = tiny.prompts[0], tiny.prompts[2][:20]
    ref = torch.log_softmax(_hf_logits(tiny.hf, prompt + cont), -1)[len(prompt) - 1 : -1]
    for result in (tiny.engine.score([prompt], [cont], top_k=3)[0], tiny.engine.verify([prompt], [cont], top_k=3)[0]):
        want = ref.gather(1, torch.tensor(cont)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(result.token_logprobs), want, rtol=1e-4, atol=1e-5)
        top = ref.topk(3, dim=-1)
        assert result.top_ids == top.indices.tolist()
        torch.testing.assert_close(torch.tensor(result.top_logprobs), top.values, rtol=1e-4, atol=1e-5)


def test_batch_invariance(tiny, E):
    sp = E.SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    alone = [tiny.engine.generate([p], sp)[0].token_ids for p in tiny.prompts]
    together = [o.token_ids for o in tiny.engine.generate(tiny.prompts, sp)]
    assert together == alone


def test_more_requests_than_batch_slots_are_queued(tiny, E):
    prompts = [[i + 1] * (i + 2) for i in range(9)]  # 9 requests, max_batch_size 4
    sp = E.SamplingParams(max_new_tokens=6, ignore_eos=True)
    outs = tiny.engine.generate(prompts, sp)
    assert [o.token_ids for o in outs] == [tiny.engine.generate([p], sp)[0].token_ids for p in prompts]


@pytest.mark.slow
def test_page_boundary_crossings(E):
    """Page size 1, 3 and 16 (prompt ends exactly on / just past a boundary) give the same tokens as HF."""
    model_dir = resolve_model("tiny-qwen3")
    hf = _hf(model_dir)
    prompts = [[7] * 15, [8] * 16, [9] * 17, list(range(1, 33))]
    for page_size in (1, 3, 16):
        eng = E.Engine(model_dir, E.EngineOptions(device="cpu", max_batch_size=4, max_seq_len=128,
                                                  page_size=page_size)).build()
        outs = eng.generate(prompts, E.SamplingParams(max_new_tokens=20, ignore_eos=True))
        assert [o.token_ids for o in outs] == [_hf_greedy(hf, p, 20) for p in prompts], page_size


def test_seeded_sampling_reproducible_and_batch_independent(tiny, E):
    sp = E.SamplingParams(max_new_tokens=20, temperature=0.9, top_k=50, top_p=0.9, seed=7, ignore_eos=True)
    a = tiny.engine.generate([tiny.prompts[0]], sp)[0].token_ids
    b = tiny.engine.generate([tiny.prompts[0], tiny.prompts[1]],
                             [sp, E.SamplingParams(max_new_tokens=5, temperature=1.0, seed=1)])[0].token_ids
    other = tiny.engine.generate([tiny.prompts[0]], E.SamplingParams(max_new_tokens=20, temperature=0.9, top_k=50,
                                                                    top_p=0.9, seed=8, ignore_eos=True))[0]
    assert a == b
    assert other.token_ids != a  # the seed matters


def test_eos_and_stop_tokens_end_generation(tiny, E):
    out = tiny.engine.generate([tiny.prompts[0]], E.SamplingParams(max_new_tokens=10, ignore_eos=True))[0]
    stop_at = out.token_ids[3]
    stopped = tiny.engine.generate([tiny.prompts[0]], E.SamplingParams(max_new_tokens=10,
                                                                     stop_token_ids=(stop_at,)))[0]
    first = out.token_ids.index(stop_at)
    assert stopped.token_ids == out.token_ids[: first + 1] and stopped.finish_reason == "stop"


def test_overlapped_decode_stops_each_request_where_it_would_alone(tiny, E):
    """Decode runs one step ahead of the host: rows that stop on a token (stop id), by their own length or at
    the context limit (whose pages end there) in one batch, beside a sampled row, end exactly as they do alone,
    and a row run past its stop adds nothing to the counted tokens."""
    base = tiny.engine.generate([tiny.prompts[0]], E.SamplingParams(max_new_tokens=12, ignore_eos=True))[0]
    requests = [
        (tiny.prompts[0], E.SamplingParams(max_new_tokens=12, stop_token_ids=(base.token_ids[4],))),
        (tiny.prompts[1], E.SamplingParams(max_new_tokens=3, ignore_eos=True)),
        ([3] * 250, E.SamplingParams(max_new_tokens=40, ignore_eos=True)),   # ends at max_seq_len 256
        (tiny.prompts[2], E.SamplingParams(max_new_tokens=16, temperature=0.8, seed=3, ignore_eos=True)),
    ]
    alone = [tiny.engine.generate([p], sp)[0] for p, sp in requests]
    before = tiny.engine.stats()
    together = tiny.engine.generate([p for p, _ in requests], [sp for _, sp in requests])
    after = tiny.engine.stats()
    assert together == alone
    assert [o.finish_reason for o in together] == ["stop", "length", "length", "length"]
    assert len(together[2].token_ids) == 6
    assert after["generated_tokens"] - before["generated_tokens"] == sum(len(o.token_ids) for o in together)
    # one step per token after the prefill's, plus at most one step ahead past a stop id
    assert after["decode_steps"] - before["decode_steps"] <= 16 - 1 + 1
    # rows that end by length are known to end: not one step is wasted on them
    before = tiny.engine.stats()["decode_steps"]
    tiny.engine.generate(tiny.prompts[:2], [E.SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (5, 9)])
    assert tiny.engine.stats()["decode_steps"] - before == 9 - 1


@pytest.mark.parametrize("prompt, params, message", [
    ([], {}, "non-empty"),
    ([1] * 300, {}, "context limit"),
    ([1, 2, 10**9], {}, "outside"),
    ([1, 2], {"max_new_tokens": 0}, "max_new_tokens"),
    ([1, 2], {"temperature": -1.0}, "temperature"),
    ([1, 2], {"top_p": 0.0}, "top_p"),
    ([1, 2], {"top_k": -3}, "top_k"),
])
def test_bad_requests_get_clear_errors_and_engine_keeps_serving(tiny, E, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        tiny.engine.generate([[1, 2, 3], prompt], E.SamplingParams(**params))
    out = tiny.engine.generate([[1, 2, 3]], E.SamplingParams(max_new_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3
    assert tiny.engine.allocator.free_pages == tiny.engine.allocator._free.__len__()  # nothing leaked
    assert all(not row.any() for row in tiny.engine.page_table.table[1:])


def test_bad_model_dirs(E, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        E.Engine(tmp_path / "nope")
    with pytest.raises(ValueError, match="no config.json"):
        E.Engine(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        E.Engine(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="not supported"):
        E.Engine(tmp_path)
    good = resolve_model("tiny-qwen3")
    cfg = json.loads((good / "config.json").read_text())
    del cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden_size"):
        E.Engine(tmp_path)
    broken = tmp_path / "noweights"
    shutil.copytree(good, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(ValueError, match="safetensors"):
        E.Engine(broken).build()


def test_bfloat16_on_cpu_follows_float32(E):
    model_dir = resolve_model("tiny-qwen3")
    sp = E.SamplingParams(max_new_tokens=12, ignore_eos=True)
    bf16, fp32 = (E.Engine(model_dir, E.EngineOptions(dtype=dt, max_batch_size=2, max_seq_len=128)).build()
                  for dt in ("bfloat16", "float32"))
    prompt = [1, 2, 3, 4, 5, 6]
    ref = fp32.generate([prompt], sp)[0].token_ids
    # Greedy paths may part at a near-tie after a while; teacher-forced on fp32's tokens, bf16 must agree.
    assert bf16.generate([prompt], sp)[0].token_ids[:8] == ref[:8]
    a, b = (e.score([prompt], [ref], top_k=1)[0] for e in (bf16, fp32))
    assert sum(x[0] == y[0] for x, y in zip(a.top_ids, b.top_ids)) >= len(ref) - 1
    assert max(abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs)) < 0.1


def test_attention_backend_choice_and_its_errors(E):
    from engine.attention_backend import AttentionConfig
    from engine.attention_registry import ATTENTION_BACKENDS, select_backend

    def config(dtype):
        return AttentionConfig(num_heads=16, num_kv_heads=8, head_dim=128, dtype=dtype, device=torch.device("cpu"),
                               max_batch_size=4, page_size=16, max_pages_per_request=64)

    assert list(ATTENTION_BACKENDS) == ["torch", "triton", "flashinfer"]
    assert select_backend("auto", config(torch.float32)).name == "torch"
    assert select_backend("auto", config(torch.bfloat16)).name == "torch"
    assert select_backend("torch", config(torch.bfloat16)).name == "torch"
    for name in ("flashinfer", "triton"):
        with pytest.raises(ValueError, match=f"the {name} attention backend needs a CUDA device"):
            select_backend(name, config(torch.bfloat16))
    with pytest.raises(ValueError, match=r"'flash' \(choose auto, torch, triton or flashinfer\)"):
        select_backend("flash", config(torch.bfloat16))


def test_forward_batch_is_built_by_keyword(E):
    from engine.batch import ForwardBatch
    t = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(TypeError):
        ForwardBatch(True, t, t, t, t, t[None], t)
    batch = ForwardBatch(is_decode=True, input_ids=t, positions=t, out_slots=t, seq_lens=t.int(), page_table=t[None],
                         logit_rows=t)
    assert batch.batch_size == 1 and batch.extend_lens == () and not batch.cuda_graph


def test_attention_modules_import_no_circle():
    """The interface, the backends and the registry import one another in one direction only (function-level
    imports included), so any of them can be read and loaded on its own."""
    import ast

    from seis.engine_import import ENGINE_TEMPLATE
    engine_dir = ENGINE_TEMPLATE / "engine"
    names = ("attention_backend", "attention", "flashinfer_attention", "attention_registry")
    imports = {n: {node.module for node in ast.walk(ast.parse((engine_dir / f"{n}.py").read_text()))
                   if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in names}
               for n in names}
    assert imports == {"attention_backend": set(), "attention": {"attention_backend"},
                       "flashinfer_attention": {"attention_backend"},
                       "attention_registry": {"attention", "attention_backend", "flashinfer_attention"}}
