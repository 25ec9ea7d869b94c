"""What this host offers an engine: where device "auto" lands, free RAM, free GPU memory (NVML: the parent
process never initialises CUDA). One place for the run preflight, post-validation and the config's defaults."""
from __future__ import annotations

import os
from pathlib import Path


def runs_on_cuda(device: str) -> bool:
    if device != "auto":
        return device.split(":")[0] == "cuda"
    import torch  # lazy: only to learn where "auto" lands
    return torch.cuda.is_available()


def missing_device(device: str) -> str | None:
    """Why the CUDA device `device` (cuda, cuda:N) is not on this host ("this machine has ..."), or None: it is, or
    `device` is cpu or auto, which always land somewhere."""
    if device.split(":")[0] != "cuda":
        return None
    import torch  # lazy: only to ask which GPUs exist
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(device.partition(":")[2] or 0) < count:
        return None
    return f"this machine has GPUs 0 to {count - 1}" if count else "this machine has no usable CUDA GPU"


def available_ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def nvml_handle(pynvml, device: str):
    """The NVML handle of the GPU a child sees as `device`, honouring CUDA_VISIBLE_DEVICES."""
    index = int(device.split(":")[1]) if ":" in device else 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        entry = visible[index]
        if entry.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        return pynvml.nvmlDeviceGetHandleByUUID(entry)
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def free_gpu_bytes(device: str) -> int | None:
    """None when unknown (no nvidia-ml-py, no NVML): the check is then skipped and engines report real OOMs."""
    try:
        import pynvml  # nvidia-ml-py; optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(nvml_handle(pynvml, device)).free)
    except Exception:
        return None
