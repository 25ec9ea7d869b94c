"""The memory-bandwidth bound on single-request decode, and energy per token from NVML.

A decode step must read every weight once plus the KV cache of the whole context, so
    bound tok/s = bandwidth / (weight bytes + KV bytes per context token x mean context).
Bandwidth is measured in a separate process (the parent never initialises CUDA) or configured.
"""
from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..host import nvml_handle
from ..models.model_config import read_model_config

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "int8": 1, "uint8": 1, "float64": 8}


def dtype_bytes(dtype: str) -> int:
    name = dtype.removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return DTYPE_BYTES[name]


def safetensors_numels(model_dir: str | Path) -> dict[str, int]:
    """Tensor name -> element count, read from the safetensors headers only (no weights loaded)."""
    out: dict[str, int] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                out[name] = math.prod(meta["shape"])
    return out


def weight_bytes_per_token(model_dir: str | Path, dtype: str) -> int:
    """Bytes of weights one decode step reads at the run dtype.

    An untied input embedding is only gathered (one row per token), so its table is not counted; a tied one
    is counted once, as the LM head that reads all of it.
    """
    numels = safetensors_numels(model_dir)
    tied = read_model_config(model_dir).tie_word_embeddings
    has_head = any(name.endswith("lm_head.weight") for name in numels)
    total = 0
    for name, n in numels.items():
        if name.endswith("embed_tokens.weight") and has_head and not tied:
            continue
        total += n
    return total * dtype_bytes(dtype)


def kv_bytes_per_token(model_dir: str | Path, dtype: str) -> int:
    """K and V of one context token, summed over layers."""
    return read_model_config(model_dir).kv_bytes_per_token(dtype_bytes(dtype))


def mean_decode_context(prompt_lens: Sequence[int], output_lens: Sequence[int]) -> float:
    """Token-weighted mean context length over all decode steps (token t of a request sees prompt + t)."""
    total = sum(output_lens)
    if total == 0:
        return float(sum(prompt_lens) / max(len(prompt_lens), 1))
    ctx = sum(p * o + o * (o - 1) / 2 for p, o in zip(prompt_lens, output_lens, strict=True))
    return ctx / total


def bound_tok_per_s(bytes_per_s: float, weight_bytes: int, kv_per_token: int, mean_context: float) -> float:
    return bytes_per_s / (weight_bytes + kv_per_token * mean_context)


_MEASURE = r"""
import json, sys, time, torch
dev = sys.argv[1]
cuda = dev.startswith("cuda")
n = (1 << 30 if cuda else 1 << 28) // 4  # 1 GiB on a GPU, 256 MiB on a CPU (float32 elements)
src = torch.ones(n, device=dev)
dst = torch.empty_like(src)
best = float("inf")
for _ in range(8):
    if cuda: torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    dst.copy_(src)
    if cuda: torch.cuda.synchronize(dev)
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"bytes_per_s": 2 * n * 4 / best}))  # a copy reads and writes every byte
"""


def measure_bandwidth(device: str, timeout_s: float = 300.0) -> tuple[float, str]:
    """Copy bandwidth (read + write bytes per second) of `device` ("cpu", "cuda", "cuda:N"), in a child."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, device], capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"bandwidth measurement on {device} failed: {proc.stderr.strip()[-500:]}")
    value = json.loads(proc.stdout.strip().splitlines()[-1])["bytes_per_s"]
    what = "cuda device-to-device copy" if device.startswith("cuda") else "cpu tensor copy"
    return value, f"measured {what}"


class EnergyMeter:
    """Cumulative GPU energy from NVML (mJ counter); unavailable off CUDA or without nvidia-ml-py."""

    def __init__(self, device: str):
        self.available = False
        self.note = "energy unavailable: engines run on the CPU"
        if not device.startswith("cuda"):
            return
        try:
            import pynvml  # nvidia-ml-py; optional
        except ImportError:
            self.note = "energy unavailable: pynvml (nvidia-ml-py) is not installed"
            return
        try:
            pynvml.nvmlInit()
            self._handle = nvml_handle(pynvml, device)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except Exception as exc:  # NVML errors (no driver, pre-Volta GPU) only disable the measurement
            self.note = f"energy unavailable: NVML: {exc}"
            return
        self._nvml = pynvml
        self.available = True
        self.note = "energy from NVML total energy consumption, GPU of the engines"

    def read_j(self) -> float | None:
        if not self.available:
            return None
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0
