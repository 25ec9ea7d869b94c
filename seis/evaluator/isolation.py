"""How the gate's engine processes are confined, and the record of it that goes into every verdict.

Every engine (reference, parent and candidate alike) runs through seis.engine_host in the one sandbox of
seis.sandbox: an unprivileged user in its own namespaces, seeing only its private tree copy, the model and a
scratch directory. This module adds the gate's own settings (memory cap, CPU threads) and checks that the
sandbox works here before any engine starts.
"""
from __future__ import annotations

import resource
from dataclasses import dataclass, field

from ..engine_host.policy import CACHE_MOUNT, ENGINE_MOUNT, MODEL_MOUNT, HOST_MOUNT
from ..sandbox import INSTALL_HINT, OFFLINE_ENV, SandboxUnavailable, allowed_env, bwrap_version
from .errors import GateInputError
from .gate_config import IsolationConfig

VISIBLE = (f"{ENGINE_MOUNT} (its private tree copy, read-only)", f"{MODEL_MOUNT} (read-only)",
           f"{HOST_MOUNT}/worker.py and engine_import.py (read-only)",
           f"{CACHE_MOUNT} (its own JIT cache, writable)", "/tmp (private, RAM-backed)",
           "the read-only system (/usr, /lib*, /sys, a few /etc files, the Python installation)")


@dataclass(frozen=True)
class Isolation:
    """Settings shared by every engine process of one gate."""

    sandbox: str                      # what bubblewrap provides here, in words
    env: dict[str, str] = field(default_factory=dict)  # over the sandbox's allow-listed environment
    memory_limit: str = "none"
    memory_limit_bytes: int | None = None

    @property
    def env_keys(self) -> list[str]:
        return sorted({**allowed_env(), **self.env})


def memory_limits(device_type: str, cfg: IsolationConfig) -> tuple[str, int | None]:
    if cfg.memory_limit_gb is None:
        return "none (disabled)", None
    if device_type != "cpu":
        return "none (CUDA reserves a huge virtual address space, so RLIMIT_AS cannot be used)", None
    limit = int(cfg.memory_limit_gb * 2**30)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    return f"RLIMIT_AS {limit / 2**30:g} GiB", limit


def make_isolation(device_type: str, cfg: IsolationConfig) -> Isolation:
    try:
        version = bwrap_version()
    except SandboxUnavailable as e:
        raise GateInputError(f"the gate runs engines only inside its sandbox, which is unavailable: {e} "
                             f"({INSTALL_HINT})") from None
    memory, limit = memory_limits(device_type, cfg)
    env: dict[str, str] = {}
    if device_type == "cpu" and cfg.cpu_threads:
        env = {"OMP_NUM_THREADS": str(cfg.cpu_threads), "MKL_NUM_THREADS": str(cfg.cpu_threads)}
    return Isolation(sandbox=f"{version}; unprivileged user, no capabilities, no_new_privs, own PID/mount/IPC/"
                             f"UTS/network namespaces", env=env, memory_limit=memory, memory_limit_bytes=limit)


__all__ = ["Isolation", "OFFLINE_ENV", "VISIBLE", "make_isolation", "memory_limits"]
