"""run_shell for SDK agents: bash in the workspace, time-limited, output-truncated, an environment without
API keys, and no network when the kernel allows it (`unshare --net`, detected once). Where a mount namespace is
also allowed, the evaluator's code and the prepared / held-out data are covered by empty read-only tmpfs
mounts, so a shell command can't read them either."""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SandboxKind = Literal["net+mount", "net", "none"]
# Enough for Python, compilers and git; everything else (API keys included) is dropped.
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
            "LD_LIBRARY_PATH", "SEIS_CACHE", "HF_HOME", "PYENV_ROOT", "PYENV_VERSION", "VIRTUAL_ENV",
            "CONDA_PREFIX")
MAX_OUTPUT_CHARS = 20_000

_SANDBOX_SCRIPT = ('cmd="$1"; shift; for d in "$@"; do mount -t tmpfs -o ro,size=4k seis-hidden "$d" '
                   '|| { echo "seis sandbox: cannot hide $d" >&2; exit 97; }; done; exec bash -c "$cmd"')


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@dataclass(frozen=True)
class Sandbox:
    kind: SandboxKind
    prefix: tuple[str, ...] = ()   # the unshare invocation ("net+mount" adds the hiding script after it)


NO_SANDBOX = Sandbox("none")


@functools.lru_cache(maxsize=1)
def detect_sandbox() -> Sandbox:
    """The strongest isolation this machine allows (checked once per process)."""
    userns = ("unshare", "--net", "--map-root-user", "--mount")
    with tempfile.TemporaryDirectory(prefix="seis-probe-") as probe:
        if _works([*userns, "bash", "-c", _SANDBOX_SCRIPT, "probe", "true", probe]):
            return Sandbox("net+mount", userns)
    for prefix in (("unshare", "--net"), ("unshare", "--net", "--map-root-user")):  # root, then rootless
        if _works([*prefix, "true"]):
            return Sandbox("net", prefix)
    return NO_SANDBOX


def default_hidden_dirs() -> tuple[Path, ...]:
    """What a shell command must not read: the evaluator's code and the prepared / held-out data."""
    from ...workloads.common import DEFAULT_PREPARED_DIR, PROJECT_ROOT
    gsm8k = Path(os.environ.get("SEIS_GSM8K_DIR", PROJECT_ROOT.parent / "shared" / "data" / "gsm8k"))
    return (DEFAULT_PREPARED_DIR.parent, gsm8k, PROJECT_ROOT / "seis" / "evaluator")


def clean_env(home: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # A scratch HOME: the user's dotfiles (SDK credential files, ~/.netrc) stay out of reach.
    env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", NO_PROXY="*")
    return env


def truncate(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


@dataclass(frozen=True)
class ShellResult:
    returncode: int | None   # None: killed at the time limit
    output: str              # stdout and stderr interleaved, truncated

    def render(self, timeout_s: float) -> str:
        status = f"timed out after {timeout_s:.0f} s (killed)" if self.returncode is None else \
            f"exit code {self.returncode}"
        return f"[{status}]\n{self.output}"


def run_shell(command: str, cwd: Path, timeout_s: float, sandbox: Sandbox, home: Path,
              hidden: tuple[Path, ...] = ()) -> ShellResult:
    """home: a scratch HOME outside the workspace (caches written there don't end up in the engine tree)."""
    real_cwd = cwd.resolve()
    # A hidden dir that holds the workspace would hide the workspace too: leave such a dir visible.
    hide = [str(d) for d in hidden if d.is_dir() and real_cwd != d.resolve() and d.resolve() not in
            real_cwd.parents]
    if sandbox.kind == "net+mount":
        argv = [*sandbox.prefix, "bash", "-c", _SANDBOX_SCRIPT, "seis-sandbox", command, *hide]
    else:
        argv = [*sandbox.prefix, "bash", "-c", command]
    proc = subprocess.Popen(argv, cwd=real_cwd, env=clean_env(home), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: killable as a whole
    out, _, timed_out = communicate_or_kill(proc, None, timeout_s)
    return ShellResult(None if timed_out else proc.returncode, truncate(out.decode("utf-8", errors="replace")))


def communicate_or_kill(proc: subprocess.Popen, stdin: bytes | None, timeout_s: float
                        ) -> tuple[bytes, bytes | None, bool]:
    """(stdout, stderr, timed_out); past the limit the whole process group (start_new_session) is killed."""
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
        return out, err, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return out, err, True
