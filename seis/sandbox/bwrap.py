"""The bubblewrap command line for a policy: namespaces, the read-only system view, and the user switch.

Run as root, bwrap builds the mount, PID, IPC, UTS and network namespaces with root's privileges, then
`setpriv` (util-linux) becomes the sandbox's own unprivileged user with no capabilities, an empty bounding set
and no_new_privs, and execs the command. Run as an ordinary user, bwrap makes a user namespace as well and drops
every capability itself. Either way the process cannot unmount, remount or see anything the policy did not name.
Every process inside runs under the seccomp filter of seccomp.py (bwrap installs it, with no_new_privs).
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from . import seccomp
from .gpus import gpu_args
from .policy import SandboxPolicy

# The read-only system: programs, libraries, compilers (Triton and FlashInfer build at run time), and the few
# /etc files that the loader, Python and compilers read. /etc as a whole, /home, /root, /run, /var, /srv,
# /mnt and /media are never shown.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "nsswitch.conf", "localtime",
             "os-release", "ssl", "ca-certificates", "mime.types", "gai.conf", "host.conf")
HOSTNAME = "seis-sandbox"


class SandboxUnavailable(RuntimeError):
    """bubblewrap (or setpriv, as root) is missing or cannot create namespaces on this host."""


INSTALL_HINT = "install the Debian/Ubuntu package `bubblewrap` (apt-get install bubblewrap; scripts/setup.sh does)"


@functools.lru_cache(maxsize=1)
def bwrap_version() -> str:
    """'bubblewrap X.Y.Z' once it is known to start a sandbox here, seccomp filter included; SandboxUnavailable
    otherwise (never a sandbox without the filter)."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxUnavailable(f"no `bwrap` on PATH: {INSTALL_HINT}")
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        raise SandboxUnavailable("no `setpriv` on PATH (util-linux): needed to drop root inside the sandbox")
    if shutil.which("prlimit") is None:
        raise SandboxUnavailable("no `prlimit` on PATH (util-linux): needed to set the sandbox's limits")
    if not seccomp.supported():
        raise SandboxUnavailable(f"the sandbox's seccomp filter is written for x86-64 only, not {platform.machine()}")
    filter_fd = seccomp.program_fd()
    probe = [exe, *namespace_args(root=os.geteuid() == 0), *system_args(), "--proc", "/proc", "--dev", "/dev",
             "--seccomp", str(filter_fd), "--", *user_switch(61999), "/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, pass_fds=(filter_fd,))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailable(f"bwrap did not start: {e}") from None
    finally:
        os.close(filter_fd)
    if done.returncode != 0:
        raise SandboxUnavailable(f"bwrap cannot create its namespaces or install its seccomp filter here: "
                                 f"{done.stderr.strip()[:300]} (in a container, allow user namespaces and seccomp, "
                                 f"or run it privileged)")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    return version or "bubblewrap"


def namespace_args(root: bool, network: str = "none") -> list[str]:
    ns = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", *(["--unshare-net"] if network != "host" else []),
          "--unshare-cgroup-try", "--hostname", HOSTNAME, "--die-with-parent", "--new-session"]
    return ns if root else [*ns, "--unshare-user", "--cap-drop", "ALL"]


def network_args(network: str) -> list[str]:
    """With the host's network: the resolver files (their targets, as /etc/resolv.conf is often a link)."""
    if network != "host":
        return []
    args: list[str] = []
    for name in ("resolv.conf", "hosts"):
        real = Path(f"/etc/{name}").resolve()
        if real.is_file():
            args += ["--ro-bind", str(real), f"/etc/{name}"]
    return args


def user_switch(uid: int | None) -> list[str]:
    """As root: become `uid` with nothing left of root. Unprivileged: bwrap already dropped everything."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


def _show(path: str, writable: bool = False) -> list[str]:
    """Mount host `path` at the same place; a symlink (merged /usr) is recreated as that symlink."""
    p = Path(path)
    if p.is_symlink():
        return ["--symlink", os.readlink(p), path]
    if not p.exists():
        return []
    return ["--bind" if writable else "--ro-bind", path, path]


def _shown(raw: str, forbidden: tuple[Path, ...]) -> Path | None:
    """raw resolved, if it exists, is neither inside nor above a forbidden path (the project checkout), and is
    neither a home directory nor above one."""
    path = Path(raw).resolve()
    if not path.exists() or any(_overlaps(path, f) for f in forbidden):
        return None
    if any(path == home or path in home.parents for home in homes()):
        return None
    return path


@functools.lru_cache(maxsize=1)
def _account_homes() -> tuple[str, ...]:
    """Home directories of root, of this process's account and of every account a person gets (uids 1000 up to
    the usual UID_MAX, 60000; not nobody's)."""
    try:
        import pwd
        entries = pwd.getpwall()
    except (ImportError, OSError, KeyError):
        return ()
    return tuple(e.pw_dir for e in entries if e.pw_uid in (0, os.getuid()) or 1000 <= e.pw_uid < 60000)


def homes() -> tuple[Path, ...]:
    """Home directories, which hold their owners' credentials (~/.ssh, ~/.aws, a token in ~/.cache/huggingface, an
    API key exported in ~/.bashrc): a home, or a directory above one, is never shown whole, though the operator's
    PYTHONPATH, LD_LIBRARY_PATH or CPATH name it (`PYTHONPATH=$HOME`, or `.` run from the home) or Python lives
    right in it. What lies inside one (a pyenv or conda installation, a venv, ~/.local/lib) is shown as before."""
    found = {os.environ.get("HOME", ""), os.path.expanduser("~"), *_account_homes()}
    return tuple(Path(h).resolve() for h in sorted(found) if h.startswith("/") and h != "/")


def _operator_entries(var: str) -> list[str]:
    return [p for p in os.environ.get(var, "").split(os.pathsep) if p]


def python_paths(forbidden: tuple[Path, ...]) -> list[str]:
    """Where this interpreter and its packages live (a venv's base too), plus PYTHONPATH and library-path
    entries the operator set, except anything inside or above a forbidden path (the project checkout) and any
    home directory or directory above one (homes())."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parents[1])]
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH", "CPATH"):
        found += _operator_entries(var)
    out: list[str] = []
    for raw in found:
        path = _shown(raw, forbidden)
        if path is None or str(path) in out:
            continue
        if any(str(path).startswith(s + "/") or str(path) == s for s in ("/usr", "/lib", "/lib64", "/bin")):
            continue  # already in the system view
        out.append(str(path))
    return sorted(out, key=len)  # parents before children


def python_search_path(forbidden: tuple[Path, ...]) -> str:
    """The operator's PYTHONPATH as the sandbox shows it: its entries that exist and are not forbidden, in order.
    Packages installed with `pip install --target DIR` and found through PYTHONPATH=DIR (an optional kernel
    library such as FlashInfer) import inside as outside; a checkout on PYTHONPATH stays out."""
    kept = [str(p) for p in (_shown(raw, forbidden) for raw in _operator_entries("PYTHONPATH")) if p is not None]
    return os.pathsep.join(dict.fromkeys(kept))


def search_path(forbidden: tuple[Path, ...]) -> str:
    """PATH inside: the interpreter's directory (a venv's tools: the `ninja` that FlashInfer's JIT calls), the
    operator's PATH entries that the sandbox shows (under the system view or the Python installation: where
    `nvcc` may be), then the system's. Entries the sandbox does not show would only name missing directories."""
    from .policy import SAFE_PATH

    roots = [Path(r).resolve() for r in (*SYSTEM_DIRS, *python_paths(forbidden)) if Path(r).exists()]
    kept: list[str] = []
    for raw in (str(Path(sys.executable).parent), *_operator_entries("PATH"), *SAFE_PATH.split(":")):
        path = _shown(raw, forbidden)
        if path is not None and any(path == r or r in path.parents for r in roots):
            kept.append(str(path))
    return ":".join(dict.fromkeys(kept)) or SAFE_PATH


def _overlaps(a: Path, b: Path) -> bool:
    b = b.resolve()
    return a == b or b in a.parents or a in b.parents


@functools.lru_cache(maxsize=8)
def masked_files(forbidden: tuple[Path, ...]) -> tuple[str, ...]:
    """Files of the shown Python installation that would name a forbidden path (the checkout) inside: an
    editable install's finder and `direct_url.json`, `.pth` and `.egg-link` files holding the path, and the `.pth`
    files that import a masked finder (left alone, they would print an error at every interpreter start)."""
    needles = [str(p.resolve()) for p in forbidden]
    if not needles:
        return ()
    site_dirs = {str(Path(p).resolve()) for p in (*_site_packages(), *sys.path) if p and Path(p).is_dir()}
    masked: list[str] = []
    pth: list[Path] = []
    for site_dir in sorted(site_dirs):
        if any(_overlaps(Path(site_dir), Path(f)) for f in needles):
            continue  # not shown at all
        for entry in Path(site_dir).iterdir():
            name = entry.name
            if name.endswith(".pth"):
                pth.append(entry)
            candidates = [entry] if name.endswith((".pth", ".egg-link")) or name.startswith("__editable__") else []
            if name.endswith(".dist-info"):
                candidates.append(entry / "direct_url.json")
            masked += [str(c) for c in candidates if c.is_file() and _names_any(c, needles)]
    finders = {Path(m).stem: Path(m).parent for m in masked if m.endswith(".py")}
    masked += [str(p) for p in pth if str(p) not in masked and finders and _names_any(p, sorted(finders))]
    for stem, where in finders.items():  # their compiled copies hold the same path
        masked += [str(c) for c in (where / "__pycache__").glob(f"{stem}.*.pyc")]
    shown = [*python_paths(forbidden), *SYSTEM_DIRS]
    return tuple(sorted(m for m in set(masked) if any(m.startswith(d.rstrip("/") + "/") for d in shown)))


# Configuration an installation may keep beside itself that can hold the operator's credentials (a private package
# index's token in pip.conf or .condarc): the sandbox shows a Python installation's root whole, these unreadable.
CREDENTIAL_FILES = ("pip.conf", "pip.ini", ".condarc", "condarc", ".netrc", ".pypirc", ".npmrc", ".git-credentials")


def credential_files(forbidden: tuple[Path, ...]) -> tuple[str, ...]:
    """The CREDENTIAL_FILES at the root of each shown Python installation or PYTHONPATH entry, and in its etc/
    (where pip and conda look for them). Not cached: the operator's PYTHONPATH may change between sandboxes."""
    found = [d / name for root in python_paths(forbidden) for d in (Path(root), Path(root) / "etc")
             for name in CREDENTIAL_FILES]
    # a link is left as it is: bound over, it would mask (or fail on) its target; it shows only what is shown anyway
    return tuple(str(f) for f in found if f.is_file() and not f.is_symlink())


def _site_packages() -> list[str]:
    import site
    return [*site.getsitepackages(), site.getusersitepackages()]


def _names_any(path: Path, needles: list[str]) -> bool:
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return False
    return any(n in text for n in needles)


def system_args() -> list[str]:
    # /etc is made here, not implied by its first bind: bwrap would make it with the caller's umask (0700 under
    # umask 077), leaving the sandbox user unable to reach the loader cache or /etc/alternatives (/usr/local/cuda)
    args: list[str] = ["--perms", "0755", "--dir", "/etc"]
    for d in SYSTEM_DIRS:
        args += _show(d)
    for name in ETC_FILES:
        args += _show(f"/etc/{name}")
    if Path("/sys/fs").is_dir():  # the host's cgroup and filesystem layout: nothing a process here needs
        args += ["--perms", "0555", "--tmpfs", "/sys/fs"]
    return args


def _mounts(mounts: list[tuple[str, str, bool]]) -> list[str]:
    """(src, dest, writable) binds, parents first. Missing parent directories are made world-readable: bwrap
    would otherwise copy the host's mode (/root is 0700), leaving the sandbox user unable to traverse them."""
    mounts = sorted(mounts, key=lambda m: m[1].count("/"))
    under_mount = ("/usr", "/sys", "/proc", "/dev", *(m[1] for m in mounts))
    made: set[str] = {"/", "/tmp", "/etc"}
    args: list[str] = []
    for src, dest, writable in mounts:
        for parent in reversed(Path(dest).parents):
            p = str(parent)
            if p in made or any(p == m or p.startswith(m + "/") for m in under_mount if m != dest):
                continue
            args += ["--perms", "0755", "--dir", p]
            made.add(p)
        args += ["--bind" if writable else "--ro-bind", src, dest]
    return args


def command(policy: SandboxPolicy, argv: list[str], uid: int | None, info_fd: int,
            forbidden: tuple[Path, ...], seccomp_fd: int = 4) -> list[str]:
    """The full bwrap invocation running argv under policy (uid: the sandbox user, or None when unprivileged), as
    bwrap would be handed the descriptors info_fd and seccomp_fd."""
    return ["bwrap", *options(policy, uid, info_fd, forbidden, seccomp_fd), "--", *user_switch(uid), *argv]


def options(policy: SandboxPolicy, uid: int | None, info_fd: int, forbidden: tuple[Path, ...],
            seccomp_fd: int) -> list[str]:
    """bwrap's options for policy: namespaces, mounts (host paths), environment, the seccomp filter read from
    seccomp_fd (seccomp.program_fd()); not the command."""
    lim = policy.limits
    args = [*namespace_args(root=uid is not None, network=policy.network), *system_args(),
            *network_args(policy.network),
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(lim.shm_bytes), "--tmpfs", "/dev/shm",
            "--perms", "1777", "--size", str(lim.scratch_bytes), "--tmpfs", "/tmp",
            "--perms", "1777", "--dir", "/tmp/home"]
    if policy.gpus != ():
        args += gpu_args(policy.gpus)
    mounts = [(p, p, False) for p in python_paths(forbidden)]
    mounts += [(str(b.src), b.dest, b.writable) for b in policy.binds]
    args += _mounts(mounts)
    # /dev/null over each, on a mount without devices: opening it fails (pip and conda skip a config they cannot read)
    for path in (*masked_files(forbidden), *credential_files(forbidden)):
        args += ["--ro-bind", "/dev/null", path]
    args += ["--chdir", policy.cwd, "--info-fd", str(info_fd), "--seccomp", str(seccomp_fd), "--clearenv"]
    for key, value in sorted(policy.env.items()):
        args += ["--setenv", key, value]
    return args
