"""How a candidate engine process is confined: its environment, its network, its memory.

The candidate only ever runs in its own process (seis.engine_host); this module decides how that process is
launched and records what was actually applied, so a verdict says under which conditions it was reached.
"""
from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass, field

from .config import IsolationConfig
from .errors import GateInputError

# The child gets an allow-listed environment: no proxies, no API keys, no PYTHONSTARTUP. What is kept locates
# Python packages and devices the way the operator set them up (PYTHONPATH, virtualenv, CUDA/NCCL settings).
ENV_KEEP = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TZ",
                      "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "SEIS_CACHE"})
ENV_KEEP_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "TORCH", "TRITON_", "OMP_", "MKL_",
                     "OPENBLAS_", "XDG_")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
NET_LAUNCHERS = (("unshare", "--net"), ("unshare", "--net", "--map-root-user"))


@dataclass(frozen=True)
class Isolation:
    """Launch settings for every engine process of one gate (reference and candidate alike)."""

    base_env: dict[str, str]
    launcher: tuple[str, ...]
    rlimits: dict[int, int] = field(default_factory=dict)
    network_isolated: bool = False
    network_method: str = "none"
    memory_limit: str = "none"
    memory_limit_bytes: int | None = None


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    kept = {k: v for k, v in environ.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    return {**kept, **OFFLINE_ENV}


@functools.lru_cache(maxsize=1)
def detect_net_launcher() -> tuple[str, ...] | None:
    """The first `unshare --net` form that runs here (detected once per process), else None."""
    if shutil.which("unshare") is None:
        return None
    for cmd in NET_LAUNCHERS:
        try:
            if subprocess.run([*cmd, "true"], capture_output=True, timeout=10).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def memory_limits(device_type: str, cfg: IsolationConfig) -> tuple[dict[int, int], str, int | None]:
    if cfg.memory_limit_gb is None:
        return {}, "none (disabled)", None
    limit = int(cfg.memory_limit_gb * 2**30)
    if device_type == "cpu":
        return {resource.RLIMIT_AS: limit}, f"RLIMIT_AS {cfg.memory_limit_gb:g} GiB", limit
    if cfg.cuda_memory_limit == "data":
        return {resource.RLIMIT_DATA: limit}, f"RLIMIT_DATA {cfg.memory_limit_gb:g} GiB", limit
    return {}, "none (CUDA reserves a huge virtual address space, so RLIMIT_AS cannot be used)", None


def make_isolation(device_type: str, cfg: IsolationConfig) -> Isolation:
    launcher: tuple[str, ...] = ()
    method = "none (disabled)"
    if cfg.network != "off":
        found = detect_net_launcher()
        if found is None and cfg.network == "require":
            raise GateInputError("network isolation was required but `unshare --net` does not work here")
        launcher = found or ()
        method = " ".join(found) if found else "none (unshare --net not available)"
    rlimits, memory, limit_bytes = memory_limits(device_type, cfg)
    return Isolation(base_env=child_env(), launcher=launcher, rlimits=rlimits, network_isolated=bool(launcher),
                     network_method=method, memory_limit=memory, memory_limit_bytes=limit_bytes)
