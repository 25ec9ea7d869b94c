"""A deterministic byte-level tokenizer for the random-weight models, built in code (no download).

Ids 0..255 are the raw bytes (id == byte value), followed by the special tokens, so any UTF-8 text
round-trips exactly and "hello" is 5 ids.
"""
from __future__ import annotations

from pathlib import Path

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 256, 257, 258
TOKENIZER_SIZE = 256 + len(SPECIAL_TOKENS)
# Stop on the end of an assistant turn first, and on end-of-document as a fallback.
EOS_TOKEN_IDS = [IM_END_ID, ENDOFTEXT_ID]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map, which the ByteLevel (de)coder expects."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_byte_tokenizer(model_max_length: int):
    """A `PreTrainedTokenizerFast` with 256 byte tokens + ChatML specials and a ChatML chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_char = _bytes_to_unicode()
    # A BPE model without merges is exactly "one token per byte".
    core = Tokenizer(models.BPE(vocab={byte_char[b]: b for b in range(256)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    assert core.token_to_id(IM_END) == IM_END_ID and core.get_vocab_size() == TOKENIZER_SIZE

    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHATML_TEMPLATE,
        model_max_length=model_max_length,
    )


def save_byte_tokenizer(out_dir: Path, model_max_length: int) -> None:
    build_byte_tokenizer(model_max_length).save_pretrained(out_dir)
