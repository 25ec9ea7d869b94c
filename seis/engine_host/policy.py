"""What an engine process sees: its own tree and the model read-only, the worker script, a compile cache, and
the read-only system. No project checkout, no store, no run directory, no data, no other engine."""
from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from ..sandbox import Bind, Limits, SandboxPolicy, allowed_env, sandbox_gpus

HOST_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = HOST_DIR.parents[1]
ENGINE_MOUNT, MODEL_MOUNT, HOST_MOUNT, CACHE_MOUNT = "/engine", "/model", "/seis-host", "/cache"
WORKER = f"{HOST_MOUNT}/worker.py"
# What an engine may write to the host's disk, its compile cache and its stderr log together (JIT caches of the
# library's kernels take well under 1 GiB): past either bound its sandbox is killed (seis.sandbox.WriteWatch).
ENGINE_WRITTEN_BYTES, ENGINE_WRITTEN_ENTRIES = 8 * 2**30, 100_000


def engine_sandbox_memory_bytes() -> int:
    """Host memory one engine sandbox may hold at once (GPU memory is not host memory): half the host, at least
    8 GiB. A memory cgroup counts its processes and its RAM-backed /tmp and /dev/shm; where the host lets SEIS make
    none, the memory watch counts its processes. Room for a JIT compile of many jobs in one engine; past it the
    sandbox is killed, and what a gate's engines hold together is the OOM killer's to bound (sandboxes go first)."""
    from ..sandbox.cgroup import host_memory_bytes
    return max(8 * 2**30, host_memory_bytes() // 2)


def cache_env(root: str) -> dict[str, str]:
    """Point every JIT cache the engine's libraries know of (Triton, Inductor, FlashInfer, CUDA's PTX cache) at
    `root` inside the sandbox."""
    return {"XDG_CACHE_HOME": root, "TRITON_CACHE_DIR": f"{root}/triton", "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
            "FLASHINFER_WORKSPACE_BASE": root, "CUDA_CACHE_PATH": f"{root}/nv", "TORCH_EXTENSIONS_DIR": f"{root}/ext"}


@functools.lru_cache(maxsize=1)
def libcuda_dir() -> str | None:
    """Where the driver's libcuda.so.1 lives, found on the host. Triton looks it up with `ldconfig -p`, which
    fails inside the sandbox on some images; TRITON_LIBCUDA_PATH tells it directly."""
    if os.environ.get("TRITON_LIBCUDA_PATH"):
        return os.environ["TRITON_LIBCUDA_PATH"]
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in listing.splitlines():
        if "libcuda.so.1 " in line and "=>" in line:
            return str(Path(line.split("=>")[-1].strip()).parent)
    return None


def engine_policy(engine_dir: Path, model_dir: Path, device: str | None, env: Mapping[str, str] | None = None,
                  memory_bytes: int | None = None, cache_dir: Path | None = None,
                  sandbox_memory_bytes: int | None = None) -> SandboxPolicy:
    """env is layered over the allow-listed environment (thread counts and the like); memory_bytes: RLIMIT_AS of
    each process (CPU only); sandbox_memory_bytes: the whole sandbox's bound (default engine_sandbox_memory_bytes)."""
    binds = [Bind(engine_dir, ENGINE_MOUNT), Bind(model_dir.resolve(), MODEL_MOUNT),
             Bind(HOST_DIR / "worker.py", WORKER), Bind(PROJECT_ROOT / "seis" / "engine_import.py",
                                                           f"{HOST_MOUNT}/engine_import.py")]
    if cache_dir is not None:
        binds.append(Bind(cache_dir, CACHE_MOUNT, writable=True))
    full_env = {**allowed_env(), **cache_env(CACHE_MOUNT if cache_dir is not None else "/tmp/cache"),
                **(env or {})}
    gpus, full_env = sandbox_gpus(device, full_env)  # only the GPUs CUDA_VISIBLE_DEVICES names exist inside
    if gpus != () and libcuda_dir():
        full_env.setdefault("TRITON_LIBCUDA_PATH", libcuda_dir())
        if not libcuda_dir().startswith(("/usr/", "/lib")):  # outside the system view: show it read-only
            binds.append(Bind(Path(libcuda_dir()), libcuda_dir()))
    limits = Limits(memory_bytes=memory_bytes, max_written_bytes=ENGINE_WRITTEN_BYTES,
                    max_written_entries=ENGINE_WRITTEN_ENTRIES,
                    sandbox_memory_bytes=sandbox_memory_bytes or engine_sandbox_memory_bytes())
    # fixed_cpus: the gate pins a timed engine's threads to one CPU, and the engine must not widen its mask again
    return SandboxPolicy(tuple(binds), full_env, cwd="/tmp", gpus=gpus, limits=limits, fixed_cpus=True)


def forbidden_paths() -> tuple[Path, ...]:
    """Never shown, not even as the directory of a Python path entry: the checkout and SEIS's own cache."""
    from ..models.cache import cache_dir
    return (PROJECT_ROOT, cache_dir().resolve())
