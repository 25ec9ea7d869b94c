"""Prompts to token ids with the model's own tokenizer and chat template (transformers does the work)."""
from __future__ import annotations

from pathlib import Path


def load_tokenizer(model_dir: str | Path):
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
