"""A sandbox opens only the GPUs its role was given: CUDA_VISIBLE_DEVICES decides which /dev/nvidia<minor> nodes
are mounted at all, so code that unsets the variable still cannot reach another session's GPU. Checked on the
bwrap command line the sandbox would run, with the host's GPUs and device nodes stood in for."""
from __future__ import annotations

from pathlib import Path

import pytest

from seis.sandbox import gpus
from seis.sandbox.gpus import HostGpu, gpu_args, host_gpus, sandbox_gpus, visible_minors

NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia-modeset", "/dev/nvidia-uvm",
         "/dev/nvidia-uvm-tools", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1"]
# PCI bus order differs from minor order on purpose: index 0 is the lowest bus id, minor 2.
HOST = [HostGpu("0000:0a:00.0", 2, "GPU-aaaa-1111"), HostGpu("0000:1b:00.0", 0, "GPU-bbbb-2222"),
        HostGpu("0000:2c:00.0", 1, "GPU-cccc-3333")]


def _passed(args: list[str]) -> set[str]:
    return {args[i + 1] for i, a in enumerate(args) if a == "--dev-bind"}


def test_driver_information_is_read_in_bus_order(tmp_path: Path) -> None:
    for gpu in reversed(HOST):
        d = tmp_path / gpu.bus_id
        d.mkdir()
        (d / "information").write_text(f"Model:  NVIDIA H200\nDevice Minor:  {gpu.minor}\nGPU UUID:  {gpu.uuid}\n")
    assert host_gpus(tmp_path) == HOST
    assert host_gpus(tmp_path / "absent") == []


def test_visible_devices_name_gpus_by_index_or_uuid() -> None:
    assert visible_minors(None, HOST) is None
    assert visible_minors("", HOST) == ()
    assert visible_minors("0", HOST) == (2,)
    assert visible_minors("2,0", HOST) == (1, 2)
    assert visible_minors("GPU-bbbb-2222", HOST) == (0,)
    assert visible_minors("GPU-cccc", HOST) == (1,)  # a unique UUID prefix, as CUDA accepts
    assert visible_minors("1", []) is None           # no driver information: no guess, every GPU's node
    for bad in ("3", "GPU-dddd", "GPU-", "0,0", "MIG-aaaa-1111/1/0"):
        with pytest.raises(ValueError):
            visible_minors(bad, HOST)


def test_only_the_given_gpus_device_nodes_are_passed() -> None:
    shared = {"/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl",
              "/dev/nvidia-caps/nvidia-cap1"}
    assert _passed(gpu_args((1,), NODES)) == shared | {"/dev/nvidia1"}
    assert _passed(gpu_args((2, 0), NODES)) == shared | {"/dev/nvidia0", "/dev/nvidia2"}
    assert _passed(gpu_args(None, NODES)) == set(NODES)


def test_inside_the_gpus_are_renumbered_in_the_hosts_order(monkeypatch) -> None:
    monkeypatch.setattr(gpus, "device_nodes", lambda: NODES)
    minors, env = sandbox_gpus("cuda", {"CUDA_VISIBLE_DEVICES": "1", "PATH": "/usr/bin"}, HOST)
    assert minors == (0,) and env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # host GPUs 2 then 0 (buses 2c, 0a): inside, bus 0a is device 0 and 2c device 1, so cuda:0 stays host GPU 2
    minors, env = sandbox_gpus("cuda", {"CUDA_VISIBLE_DEVICES": "2,0"}, HOST)
    assert minors == (1, 2) and env["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert sandbox_gpus("cuda", {}, HOST) == (None, {})
    assert sandbox_gpus("cuda", {"CUDA_VISIBLE_DEVICES": ""}, HOST) == ((), {"CUDA_VISIBLE_DEVICES": ""})
    assert sandbox_gpus("cuda", {"CUDA_VISIBLE_DEVICES": "GPU-x"}, []) == (None, {"CUDA_VISIBLE_DEVICES": "GPU-x"})
    assert sandbox_gpus("cpu", {"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"}, HOST) == ((), {})
    monkeypatch.setattr(gpus, "device_nodes", lambda: [])
    assert sandbox_gpus("cuda", {"CUDA_VISIBLE_DEVICES": "0"}, HOST) == ((), {})


def test_an_engine_given_one_gpu_cannot_mount_the_others(monkeypatch, tmp_path: Path) -> None:
    from seis.engine_host.policy import engine_policy
    from seis.sandbox import bwrap
    monkeypatch.setattr(gpus, "device_nodes", lambda: NODES)
    monkeypatch.setattr(gpus, "host_gpus", lambda: HOST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc-3333")
    (tmp_path / "engine").mkdir()
    (tmp_path / "model").mkdir()
    policy = engine_policy(tmp_path / "engine", tmp_path / "model", "cuda")
    assert policy.gpus == (1,) and policy.env["CUDA_VISIBLE_DEVICES"] == "0"
    argv = bwrap.command(policy, ["python3", "-c", "pass"], uid=None, info_fd=3, forbidden=())
    passed = _passed(argv)
    assert "/dev/nvidia1" in passed and "/dev/nvidiactl" in passed
    assert not passed & {"/dev/nvidia0", "/dev/nvidia2"}


def test_an_agent_given_one_gpu_cannot_mount_the_others(monkeypatch, tmp_path: Path) -> None:
    """The agent's tools (its dev benchmark, profilers) run in the same sandbox with the session's GPU only."""
    from seis.agents.llm.confine import AgentSandbox
    from seis.sandbox import bwrap
    monkeypatch.setattr(gpus, "device_nodes", lambda: NODES)
    monkeypatch.setattr(gpus, "host_gpus", lambda: HOST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")   # host GPU 0 is minor 2 (lowest bus id)
    (tmp_path / "ws").mkdir()
    policy = AgentSandbox(device="cuda").policy(tmp_path / "ws")
    assert policy.gpus == (2,) and policy.env["CUDA_VISIBLE_DEVICES"] == "0"
    passed = _passed(bwrap.command(policy, ["sh", "-c", "true"], uid=None, info_fd=3, forbidden=()))
    assert "/dev/nvidia2" in passed and not passed & {"/dev/nvidia0", "/dev/nvidia1"}
    assert AgentSandbox(device="cpu").policy(tmp_path / "ws").gpus == ()
