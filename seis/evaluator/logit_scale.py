"""How much rounding moves an EOS logit, relative to an ordinary token's, read from the model's output matrix.

A logit is the final hidden state times the token's output row, so rounding noise in that state moves each logit
in proportion to the row's norm, and the gap between two tokens in proportion to the norm of their rows'
difference (about sqrt(|a|^2 + |b|^2) for unrelated rows). The greedy near-tie margin is set for two ordinary
tokens; a stop compares an EOS with an ordinary top-1, so where the EOS row is larger than the rest (a random
model's calibrated EOS row is 4.5x the others) the same rounding moves a stop's gap by more, and its margin
scales with it. Real models' EOS rows are ordinary: the scale is then about 1 and the stop floor decides.
"""
from __future__ import annotations

import math
from pathlib import Path

from .errors import GateInputError

# the output matrix: its own tensor, or the input embedding when the two are tied
OUTPUT_KEYS = ("lm_head.weight", "model.embed_tokens.weight")
_CHUNK_ROWS = 16384  # rows converted to float32 at once (64 MiB at hidden 1024)


def _output_matrix(model_dir: Path):
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    for key in OUTPUT_KEYS:
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                if key in st.keys():
                    return st.get_slice(key), key
    raise GateInputError(f"{model_dir}: no output matrix ({' or '.join(OUTPUT_KEYS)}) in its safetensors files")


def eos_gap_scale(model_dir: Path, eos_ids: list[int]) -> float:
    """sqrt(|w_eos|^2 + m^2) / (sqrt(2) m) for the largest EOS row, m the median output-row norm; at least 1."""
    import torch

    if not eos_ids:
        return 1.0
    rows, key = _output_matrix(Path(model_dir))
    vocab = rows.get_shape()[0]
    bad = [i for i in eos_ids if not 0 <= i < vocab]
    if bad:
        raise GateInputError(f"EOS ids {bad} are outside the output matrix {key} ({vocab} rows)")
    norms = torch.cat([rows[i:i + _CHUNK_ROWS].float().norm(dim=1) for i in range(0, vocab, _CHUNK_ROWS)])
    median = norms.median().item()
    if median <= 0:
        return 1.0
    eos = max(norms[i].item() for i in eos_ids)
    return max(1.0, math.sqrt(eos * eos + median * median) / (math.sqrt(2) * median))
