"""How much rounding moves an EOS logit, relative to an ordinary token's, read from the model's output matrix.

A logit is the final hidden state times the token's output row, so rounding noise in that state moves each logit
in proportion to the row's norm, and the gap between two tokens in proportion to the norm of their rows'
difference (about sqrt(|a|^2 + |b|^2) for unrelated rows). The greedy near-tie margin is set for two ordinary
tokens; a stop compares an EOS with an ordinary top-1, so where the EOS row is larger than the rest (a random
model's calibrated EOS row is 4.5x the others) the same rounding moves a stop's gap by more, and its margin
scales with it. Real models' EOS rows are ordinary: the scale is then about 1 and the stop floor decides.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .errors import GateInputError

# the output matrix: its own tensor, or the input embedding when the two are tied
OUTPUT_KEYS = ("lm_head.weight", "model.embed_tokens.weight")
_CHUNK_ROWS = 16384  # rows converted to float32 at once (64 MiB at hidden 1024)
# safetensors dtypes as numpy reads them; bf16, which numpy lacks, is read as its 16 bits (widened below)
_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def _output_matrix(model_dir: Path):
    """The output matrix as a read-only memory map (numpy: the orchestrating process needs no torch for it), its
    key and its safetensors dtype. The format: an 8-byte little-endian header size, a JSON header naming each
    tensor's dtype, shape and byte range, then the data."""
    import numpy as np

    files = sorted(model_dir.glob("*.safetensors"))
    headers = []
    for f in files:
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            headers.append((f, 8 + size, json.loads(fh.read(size))))
    for key in OUTPUT_KEYS:
        for f, data_start, header in headers:
            if key in header:
                info = header[key]
                if info["dtype"] not in _NUMPY_DTYPES or len(info["shape"]) != 2:
                    raise GateInputError(f"{f.name}: {key} is {info['dtype']} {info['shape']}, not a matrix of "
                                         f"{', '.join(_NUMPY_DTYPES)}")
                rows = np.memmap(f, dtype=_NUMPY_DTYPES[info["dtype"]], mode="r",
                                 offset=data_start + info["data_offsets"][0], shape=tuple(info["shape"]))
                return rows, key, info["dtype"]
    raise GateInputError(f"{model_dir}: no output matrix ({' or '.join(OUTPUT_KEYS)}) in its safetensors files")


def _row_norms(rows, dtype: str):
    import numpy as np

    norms = []
    for i in range(0, rows.shape[0], _CHUNK_ROWS):
        chunk = np.asarray(rows[i:i + _CHUNK_ROWS])
        chunk = (chunk.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else chunk.astype(np.float32)
        norms.append(np.linalg.norm(chunk, axis=1))
    return np.concatenate(norms)


def eos_gap_scale(model_dir: Path, eos_ids: list[int]) -> float:
    """sqrt(|w_eos|^2 + m^2) / (sqrt(2) m) for the largest EOS row, m the median output-row norm; at least 1."""
    import numpy as np

    if not eos_ids:
        return 1.0
    rows, key, dtype = _output_matrix(Path(model_dir))
    vocab = rows.shape[0]
    bad = [i for i in eos_ids if not 0 <= i < vocab]
    if bad:
        raise GateInputError(f"EOS ids {bad} are outside the output matrix {key} ({vocab} rows)")
    norms = _row_norms(rows, dtype)
    median = float(np.partition(norms, (len(norms) - 1) // 2)[(len(norms) - 1) // 2])  # the lower median
    if median <= 0:
        return 1.0
    eos = max(float(norms[i]) for i in eos_ids)
    return max(1.0, math.sqrt(eos * eos + median * median) / (math.sqrt(2) * median))
