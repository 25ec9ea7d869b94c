"""How the gate's engine processes are confined, and the record of it that goes into every verdict.

Every engine (reference, parent and candidate alike) runs through seis.engine_host in the one sandbox of
seis.sandbox: an unprivileged user in its own namespaces, seeing only its private tree copy, the model and a
scratch directory. This module adds the gate's own settings (memory bounds, CPU threads) and checks that the
sandbox works here before any engine starts.
"""
from __future__ import annotations

import resource
from dataclasses import dataclass, field

from ..engine_host.policy import CACHE_MOUNT, ENGINE_MOUNT, HOST_MOUNT, MODEL_MOUNT, engine_sandbox_memory_bytes
from ..sandbox import INSTALL_HINT, OFFLINE_ENV, SandboxUnavailable, allowed_env, bwrap_version
from ..sandbox.cgroup import can_cage
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
    memory_limit: str = "none"        # the memory bounds below, in words
    memory_limit_bytes: int | None = None    # RLIMIT_AS of each engine process (CPU only)
    sandbox_memory_bytes: int | None = None  # each engine sandbox as a whole (a memory cgroup, else the watch)

    @property
    def env_keys(self) -> list[str]:
        return sorted({**allowed_env(), **self.env})


def memory_limits(device_type: str, cfg: IsolationConfig) -> tuple[str, int | None, int]:
    """(the bounds in words, RLIMIT_AS per process or None, the whole sandbox's bound). The sandbox's bound holds
    on CPU and GPU alike, through a memory cgroup or, where the host allows none, the memory watch
    (seis.sandbox.memory_watch); without a cgroup a CPU sandbox's processes also get it as RLIMIT_AS (what
    seis.sandbox.process applies). CUDA gets no RLIMIT_AS: its address space reservation is huge."""
    sandbox = int(cfg.sandbox_memory_gb * 2**30) if cfg.sandbox_memory_gb else engine_sandbox_memory_bytes()
    per_process = None
    if cfg.memory_limit_gb is not None and device_type == "cpu":
        per_process = int(cfg.memory_limit_gb * 2**30)
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        if hard != resource.RLIM_INFINITY:
            per_process = min(per_process, hard)
    caged = can_cage()
    if not caged and device_type == "cpu":
        per_process = min(per_process or sandbox, sandbox)
    how = "memory cgroup" if caged else "memory watch (no memory cgroup here)"
    words = f"{how} {sandbox / 2**30:.1f} GiB per engine sandbox"
    return words + (f"; RLIMIT_AS {per_process / 2**30:.1f} GiB per process" if per_process else ""), per_process, sandbox


def make_isolation(device_type: str, cfg: IsolationConfig) -> Isolation:
    try:
        version = bwrap_version()
    except SandboxUnavailable as e:
        raise GateInputError(f"the gate runs engines only inside its sandbox, which is unavailable: {e} "
                             f"({INSTALL_HINT})") from None
    memory, limit, sandbox_limit = memory_limits(device_type, cfg)
    env: dict[str, str] = {}
    if device_type == "cpu" and cfg.cpu_threads:
        env = {"OMP_NUM_THREADS": str(cfg.cpu_threads), "MKL_NUM_THREADS": str(cfg.cpu_threads)}
    return Isolation(sandbox=f"{version}; unprivileged user, no capabilities, no_new_privs, own PID/mount/IPC/"
                             f"UTS/network namespaces", env=env, memory_limit=memory, memory_limit_bytes=limit,
                     sandbox_memory_bytes=sandbox_limit)


__all__ = ["Isolation", "OFFLINE_ENV", "VISIBLE", "make_isolation", "memory_limits"]
