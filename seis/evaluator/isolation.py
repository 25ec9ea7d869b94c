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
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

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
# A private mount namespace on top of the network one: each path named before "--" is covered by an empty,
# read-only tmpfs, then the engine command runs. So the candidate cannot read held-out data or thresholds.
HIDE_SCRIPT = ('while [ "$1" != "--" ]; do mount -t tmpfs -o size=4k,mode=0500,ro seis-hidden "$1" || exit 97; '
               'shift; done; shift; exec "$@"')


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
    hidden_paths: tuple[str, ...] = ()


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


def hide_launcher(net: tuple[str, ...], paths: tuple[Path, ...]) -> tuple[str, ...]:
    return (*net, "--mount", "--propagation", "private", "sh", "-c", HIDE_SCRIPT, "seis-hide",
            *map(str, paths), "--")


@functools.lru_cache(maxsize=4)
def detect_hide_launcher(net: tuple[str, ...]) -> bool:
    """Whether a mount namespace with a tmpfs over a path works here (detected once per process)."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "secret").write_text("x")
        cmd = [*hide_launcher(net, (Path(d),)), "sh", "-c", f'test ! -e "{d}/secret"']
        try:
            return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


def memory_limits(device_type: str, cfg: IsolationConfig) -> tuple[dict[int, int], str, int | None]:
    if cfg.memory_limit_gb is None:
        return {}, "none (disabled)", None
    limit = int(cfg.memory_limit_gb * 2**30)
    if device_type == "cpu":
        return {resource.RLIMIT_AS: limit}, f"RLIMIT_AS {cfg.memory_limit_gb:g} GiB", limit
    if cfg.cuda_memory_limit == "data":
        return {resource.RLIMIT_DATA: limit}, f"RLIMIT_DATA {cfg.memory_limit_gb:g} GiB", limit
    return {}, "none (CUDA reserves a huge virtual address space, so RLIMIT_AS cannot be used)", None


def make_isolation(device_type: str, cfg: IsolationConfig, hide: tuple[Path, ...] = ()) -> Isolation:
    """hide: directories the engine processes must not see (held-out data, the evaluator's own files)."""
    launcher: tuple[str, ...] = ()
    method = "none (disabled)"
    if cfg.network != "off":
        found = detect_net_launcher()
        if found is None and cfg.network == "require":
            raise GateInputError("network isolation was required but `unshare --net` does not work here")
        launcher = found or ()
        method = " ".join(found) if found else "none (unshare --net not available)"
    network_isolated = bool(launcher)
    hide = tuple(sorted({p.resolve() for p in hide if p.is_dir()}))
    hidden: tuple[str, ...] = ()
    if launcher and hide and detect_hide_launcher(launcher):
        launcher, hidden = hide_launcher(launcher, hide), tuple(map(str, hide))
    rlimits, memory, limit_bytes = memory_limits(device_type, cfg)
    env = child_env()
    if device_type == "cpu" and cfg.cpu_threads:
        env |= {"OMP_NUM_THREADS": str(cfg.cpu_threads), "MKL_NUM_THREADS": str(cfg.cpu_threads)}
    return Isolation(base_env=env, launcher=launcher, rlimits=rlimits, network_isolated=network_isolated,
                     network_method=method, memory_limit=memory, memory_limit_bytes=limit_bytes,
                     hidden_paths=hidden)
