"""Which code a benchmark measured: the commit, and whether the checkout differed from it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
CODE = ("seis", "engine_template", "flows", "scripts", "pyproject.toml")  # what a benchmark runs (not its outputs)


def source_commit(repo: Path = PROJECT) -> str:
    """The short commit of the checkout, with "+changes" when the code under CODE differs from it (a tracked file
    changed, or a file git does not ignore added, such as a new library entry): a figure then names the commit it
    started from and says the code that ran was not that commit. Results written elsewhere in the checkout do not
    count. SEIS_COMMIT, set where the tree was copied without its .git, is taken as it is; "unknown" without
    either."""
    if os.environ.get("SEIS_COMMIT"):
        return os.environ["SEIS_COMMIT"]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=all", "--", *CODE) else "")


def weights_label(model: str) -> str:
    """What a figure's weights are: "random weights" (speed real, text not), "real weights", or "local model"."""
    from .models.registry import REGISTRY
    entry = REGISTRY.get(model)
    return "random weights" if entry is not None and entry.kind == "random" else "real weights" if entry else \
        "local model"


def device_label(device: str = "auto") -> str:
    """The device a figure was measured on, by name: the GPU's for a CUDA device ("auto" on a CUDA host), "cpu"
    otherwise; never the GPU of a host whose run used its CPU."""
    import torch
    if device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(torch.device(device) if device.startswith("cuda") else None)
