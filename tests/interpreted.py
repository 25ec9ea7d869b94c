"""Run a check script against a candidate engine's Triton kernels under Triton's interpreter (CPU tensors).

A child process: TRITON_INTERPRET must be set before triton is imported, and a process may host only one `engine`
package (the candidate's; E0's files can be loaded beside it as standalone modules)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_interpreted(check: str, candidate: Path, cwd: Path, timeout_s: float = 300, args: list[str] = ()) -> str:
    """The check's stdout; the check gets the candidate's engine directory as argv[1], then `args`."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", check, str(candidate), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    return done.stdout
