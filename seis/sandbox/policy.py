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

# Variables that locate Python packages and devices the way the operator set them up, by exact name: nothing else
# passes, and no prefix admits a whole family (NVIDIA_APIKEY, NCCL_IB_PASSWD). No *_API_KEY, *_TOKEN, proxies,
# PYTHONSTARTUP, HOME or anything naming the caller's files.
ENV_KEEP = frozenset({
    # language and time
    "LANG", "LANGUAGE", "TZ", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE", "LC_MONETARY",
    "LC_MESSAGES", "LC_PAPER", "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION",
    # where CUDA, its headers and libraries are, and what to compile for
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CPATH", "TRITON_LIBCUDA_PATH", "TORCH_CUDA_ARCH_LIST",
    # which devices, in which order, and how the driver runs them
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    # the host's interconnect, as the operator set collectives up for it (NVLink multicast off, say)
    "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NVLS_ENABLE",
    "NCCL_CUMEM_ENABLE", "NCCL_SOCKET_IFNAME", "NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    # CPU threads
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
})
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


# Names of keys, tokens and passwords. Their values are secrets: no kept variable may hold one (NCCL_DEBUG set to a
# key), and seis.agents.llm.secrets looks for them everywhere else.
SECRET_NAME = re.compile(r"(API_?KEY|AUTH_TOKEN|ACCESS_TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|_TOKEN$|"
                         r"_KEY$|_AUTH$|_PAT$)", re.IGNORECASE)
MIN_SECRET_LEN = 8     # shorter values ("1", "true", "none") are no secret: they would match ordinary text


def allowed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment reduced to the allow-list, plus the offline switches. An allow-listed variable
    that holds a key's value (NCCL_DEBUG=$OPENAI_API_KEY) does not pass either."""
    environ = os.environ if environ is None else environ
    secrets = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LEN}
    kept = {k: v for k, v in environ.items() if k in ENV_KEEP and v not in secrets}
    return {**kept, **OFFLINE_ENV}


# How deep a tree written in a sandbox the host walks: deeper than any engine needs, far below Python's recursion
# limit. A deeper tree is refused (seis.workspace.tree, and the binds prepared for a sandbox), never recursed into.
MAX_DEPTH = 64
# How long a path inside such a tree may be (UTF-8 bytes, relative to the tree's root): an engine's longest is a
# few dozen, and any host directory the tree is kept or copied under stays far below the kernel's PATH_MAX (4096)
# with it. A longer path is removed from a workspace and is a TreeError everywhere else.
MAX_PATH_BYTES = 1024

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
    # The sandbox cannot change its CPU affinity (sched_setaffinity fails with EPERM: seis.sandbox.seccomp): for
    # engines, which the gate pins to one CPU from outside while it times them; what they start inherits the pin.
    fixed_cpus: bool = False

    def __post_init__(self) -> None:
        for b in self.binds:
            if not b.src.exists():
                raise ValueError(f"sandbox source {b.src} does not exist")
        if self.network not in ("none", "host"):
            raise ValueError(f"sandbox network must be 'none' or 'host', not {self.network!r}")
        dests = [b.dest for b in self.binds]
        if len(set(dests)) != len(dests):
            raise ValueError(f"two sandbox mounts share a mount point: {dests}")
