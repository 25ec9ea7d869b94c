"""Prompts to token ids with the model's own tokenizer and chat template (transformers does the work)."""
from __future__ import annotations

import json
from pathlib import Path

# What the models SEIS prepares name as their tokenizer class: transformers' generic fast tokenizer (one class, two
# names across versions).
_GENERIC_FAST = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(model_dir: str | Path):
    """The model's tokenizer. A generic fast one is loaded by its own class: AutoTokenizer would return the same
    class but first imports torch and much of transformers (2.6 s of CPU against 1.0), in processes that otherwise
    need neither (the gate's host side, a run's session processes)."""
    config = Path(model_dir) / "tokenizer_config.json"
    named = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if named in _GENERIC_FAST:
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(model_dir))


def encode_prompt(tokenizer, text: str, chat: bool = False, system: str | None = None) -> list[int]:
    if not chat:
        return tokenizer(text)["input_ids"]
    if not tokenizer.chat_template:
        raise ValueError("this model's tokenizer has no chat template; run without --chat")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]
