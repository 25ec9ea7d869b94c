"""Which GPUs a sandbox can open: only the device nodes of the GPUs its role was given.

CUDA_VISIBLE_DEVICES is a request a process may ignore (untrusted code can unset it and open every GPU of the host,
disturbing other sessions' timing). The sandbox instead mounts /dev/nvidia<minor> only for the GPUs named there,
besides the driver's shared nodes (nvidiactl, nvidia-uvm, ...), so the others do not exist inside. Inside, the
devices are renumbered from 0 in PCI bus order; CUDA_VISIBLE_DEVICES is rewritten so that cuda:i is still the
i-th GPU the host named.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from glob import glob
from pathlib import Path

PROC_GPUS = Path("/proc/driver/nvidia/gpus")  # one directory per GPU, named by PCI bus id
_PER_GPU_NODE = re.compile(r"/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class HostGpu:
    bus_id: str
    minor: int
    uuid: str


def host_gpus(proc: Path = PROC_GPUS) -> list[HostGpu]:
    """The host's GPUs in PCI bus order (nvidia-smi's and NVML's index order), from the driver's /proc files."""
    gpus = []
    for d in sorted(proc.iterdir()) if proc.is_dir() else []:
        info = dict(line.split(":", 1) for line in (d / "information").read_text().splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        gpus.append(HostGpu(d.name, int(info["Device Minor"]), info.get("GPU UUID", "")))
    return gpus


def device_nodes() -> list[str]:
    return sorted(glob("/dev/nvidia*")) + sorted(glob("/dev/nvidia-caps/*"))


def visible_minors(visible: str | None, gpus: list[HostGpu]) -> tuple[int, ...] | None:
    """Minors of the GPUs CUDA_VISIBLE_DEVICES names (indices in PCI bus order, or GPU UUIDs), in its order;
    None when it is unset (every GPU)."""
    if visible is None:
        return None
    if not gpus and visible.strip():
        # No driver information (/proc/driver/nvidia absent): indices and UUIDs cannot be mapped to device nodes
        # without guessing (a container may hold only /dev/nvidia3 and call it GPU 0), so every node is passed
        # and the variable alone selects the GPU, as without this isolation.
        return None
    minors = []
    for entry in (e.strip() for e in visible.split(",") if e.strip()):
        if entry.startswith("MIG-"):
            raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r}: the sandbox isolates whole GPUs, not MIG "
                             "instances; give the worker a whole GPU")
        if entry.isdigit():
            if int(entry) >= len(gpus):
                raise ValueError(f"CUDA_VISIBLE_DEVICES names GPU {entry}, but the host has {len(gpus)}")
            minors.append(gpus[int(entry)].minor)
        else:
            match = [g.minor for g in gpus if g.uuid == entry or (entry.startswith("GPU-") and
                                                                  g.uuid.startswith(entry))]
            if len(match) != 1:
                raise ValueError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(match)} GPUs of this host")
            minors.append(match[0])
    if len(set(minors)) != len(minors):
        raise ValueError(f"CUDA_VISIBLE_DEVICES names a GPU twice: {visible!r}")
    return tuple(minors)


def gpu_args(minors: tuple[int, ...] | None, nodes: list[str] | None = None) -> list[str]:
    """bwrap arguments passing the driver's shared nodes and the per-GPU nodes of `minors` (None: all)."""
    args: list[str] = []
    for dev in device_nodes() if nodes is None else nodes:
        per_gpu = _PER_GPU_NODE.match(dev)
        if per_gpu and minors is not None and int(per_gpu.group(1)) not in minors:
            continue
        if not os.path.isdir(dev):
            args += ["--dev-bind", dev, dev]
    return args


def sandbox_gpus(device: str | None, env: Mapping[str, str], gpus: list[HostGpu] | None = None
                 ) -> tuple[tuple[int, ...] | None, dict[str, str]]:
    """(the GPUs' minors to pass, and the env the sandbox gets) for a process on `device`, given the env that
    names its GPUs: () when it gets no GPU (a CPU device or a host without one), None for every GPU of the host
    (CUDA_VISIBLE_DEVICES unset)."""
    env = dict(env)
    if device == "cpu" or not device_nodes():
        for key in [k for k in env if k.startswith(("CUDA_VISIBLE", "NVIDIA_VISIBLE"))]:
            env.pop(key)
        return (), env
    gpus = host_gpus() if gpus is None else gpus
    minors = visible_minors(env.get("CUDA_VISIBLE_DEVICES"), gpus)
    if minors is None:
        return None, env
    if not minors:
        return (), env
    # Inside, the passed GPUs are numbered 0.. in PCI bus order; keep the host's order of them.
    bus_order = sorted(minors, key=lambda m: next((g.bus_id for g in gpus if g.minor == m), f"{m:08d}"))
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(bus_order.index(m)) for m in minors)
    return minors, env
