"""The `seis` command line, run as a user would run it (a real subprocess)."""
from __future__ import annotations

import subprocess
import sys

import pytest


def seis(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seis.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_models_list_names_every_model():
    out = seis("models", "list")
    assert out.returncode == 0
    for name in ("smollm2-135m-instruct", "qwen3-0.6b-random", "tiny-qwen3", "tiny-llama"):
        assert name in out.stdout


def test_models_prepare_prints_the_directory():
    out = seis("models", "prepare", "tiny-llama")
    assert out.returncode == 0 and out.stdout.strip().endswith("tiny-llama")


def test_generate_prints_only_the_generated_text():
    from transformers import AutoModelForCausalLM
    import torch
    from seis.models import resolve_model
    from seis.prompts import load_tokenizer

    out = seis("generate", "--model", "tiny-qwen3", "--max-new-tokens", "8", "--device", "cpu", "hello")
    assert out.returncode == 0, out.stderr
    model_dir = resolve_model("tiny-qwen3")
    tok = load_tokenizer(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tok("hello")["input_ids"]
    ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(ids):]
    assert out.stdout == tok.decode(ref, skip_special_tokens=True) + "\n"


@pytest.mark.slow
def test_generate_chat_on_smollm2_answers():
    out = seis("generate", "--model", "smollm2-135m-instruct", "--chat", "--max-new-tokens", "40", "What is 2+3?")
    assert out.returncode == 0, out.stderr
    assert "5" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["generate", "--model", "no-such-model", "hi"], "no-such-model"),
    (["generate", "--model", "tiny-qwen3", "   "], "prompt is empty"),
    (["generate", "--model", "tiny-qwen3", "--top-p", "0", "hi"], "top-p"),
    (["models", "prepare", "no-such-model"], "no-such-model"),
])
def test_bad_input_exits_2_with_a_clear_message(args, message):
    out = seis(*args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
