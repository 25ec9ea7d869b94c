"""What a sandboxed process may see and use: a declarative policy, validated before anything starts.

A policy names every path the process will see. Anything not named is never mounted, so it does not exist
inside the sandbox (there is nothing to unmount or to reach through /proc). The environment is built from an
allow-list, so API keys, proxies and tokens of the caller never arrive.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Variables that locate Python packages and devices the way the operator set them up. Nothing else passes:
# no *_API_KEY, *_TOKEN, proxies, PYTHONSTARTUP, HOME or anything naming the caller's files.
ENV_KEEP = frozenset({"LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CPATH", "TRITON_LIBCUDA_PATH"})
ENV_KEEP_PREFIXES = ("LC_", "CUDA_VISIBLE", "CUDA_DEVICE", "NVIDIA_", "NCCL_", "NVSHMEM_", "TORCH_CUDA_ARCH",
                     "OMP_", "MKL_", "OPENBLAS_", "TORCH_SYMM")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


# Names of keys, tokens and passwords. Nothing so named passes, whatever prefix it has (NVIDIA_API_KEY is
# NVIDIA's hosted-model key, not a device setting); seis.agents.llm.secrets looks for their values everywhere else.
SECRET_NAME = re.compile(r"(API_KEY|AUTH_TOKEN|ACCESS_TOKEN|SECRET|PASSWORD|CREDENTIAL|_TOKEN$|_KEY$)",
                         re.IGNORECASE)
MIN_SECRET_LEN = 8     # shorter values ("1", "true", "none") are no secret: they would match ordinary text


def allowed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment reduced to the allow-list, plus the offline switches. A key-named variable never
    passes, nor an allow-listed one that holds a key's value (NCCL_X=$OPENAI_API_KEY)."""
    environ = os.environ if environ is None else environ
    secrets = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LEN}
    kept = {k: v for k, v in environ.items() if (k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES))
            and not SECRET_NAME.search(k) and v not in secrets}
    return {**kept, **OFFLINE_ENV}


# How deep a tree written in a sandbox the host walks: deeper than any engine needs, far below Python's recursion
# limit. A deeper tree is refused (seis.workspace.tree, and the binds prepared for a sandbox), never recursed into.
MAX_DEPTH = 64

@dataclass(frozen=True)
class Bind:
    """A host path shown at `dest` inside the sandbox."""

    src: Path
    dest: str
    writable: bool = False

    def __post_init__(self) -> None:
        if not self.dest.startswith("/"):
            raise ValueError(f"sandbox mount point {self.dest!r} must be absolute")


@dataclass(frozen=True)
class Limits:
    """Limits inherited by everything the sandboxed process starts (per process, and for the whole sandbox)."""

    max_processes: int = 2048              # RLIMIT_NPROC of the sandbox's own user (threads count)
    memory_bytes: int | None = None        # RLIMIT_AS; None on CUDA, whose address space reservation is huge
    max_file_bytes: int = 4 * 2**30        # RLIMIT_FSIZE: no single file (logs, caches) past this
    scratch_bytes: int = 8 * 2**30         # size of the private /tmp (RAM-backed, gone with the sandbox)
    shm_bytes: int = 1 * 2**30             # size of the private /dev/shm (RAM-backed too)
    open_files: int = 65536
    # Everything the sandbox holds at once (processes, /tmp and /dev/shm pages): a memory cgroup where the host
    # lets SEIS make one, else RLIMIT_AS per process for a sandbox without GPUs; None: no such bound
    sandbox_memory_bytes: int | None = None
    # What the sandbox may write into its writable binds (host disk), all files together: its runner kills it past
    # either bound (seis.sandbox.WriteWatch, for agent and engine sandboxes); None: not watched
    max_written_bytes: int | None = None
    max_written_entries: int = 100_000
    # The same watch's floors under the free bytes and inodes of those binds' filesystems: what a walk cannot see
    # (a file unlinked while open, a directory renamed while the watch looks) still takes space there
    min_free_disk_bytes: int = 4 * 2**30
    min_free_disk_inodes: int = 1_000_000


@dataclass(frozen=True)
class SandboxPolicy:
    binds: tuple[Bind, ...]                # beyond the read-only system view
    env: Mapping[str, str] = field(default_factory=dict)  # exactly what the process gets (see allowed_env)
    cwd: str = "/tmp"
    # GPUs whose /dev/nvidia<minor> nodes exist inside (with the driver's shared nodes): () none, None every
    # GPU of the host; seis.sandbox.sandbox_gpus derives it from CUDA_VISIBLE_DEVICES
    gpus: tuple[int, ...] | None = ()
    limits: Limits = Limits()
    # "none": an own network namespace with loopback only. "host": the host's network (explicit opt-in, for a
    # process that must reach an API; it then also reaches the host's loopback services).
    network: str = "none"

    def __post_init__(self) -> None:
        for b in self.binds:
            if not b.src.exists():
                raise ValueError(f"sandbox source {b.src} does not exist")
        if self.network not in ("none", "host"):
            raise ValueError(f"sandbox network must be 'none' or 'host', not {self.network!r}")
        dests = [b.dest for b in self.binds]
        if len(set(dests)) != len(dests):
            raise ValueError(f"two sandbox mounts share a mount point: {dests}")
