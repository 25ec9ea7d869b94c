"""The one sandbox for every process that runs untrusted code (candidate engines, and what agents run).

    policy = SandboxPolicy(binds=(Bind(tree, "/engine"),), env=allowed_env())
    box = SandboxedProcess([python, "/engine/run.py"], policy)
    box.start(); ...; box.kill()      # returns only when no process of the sandbox is left

What the process gets: an unprivileged user (as root: a host uid of its own), no capabilities, no_new_privs,
its own PID, mount, IPC, UTS and network namespaces (loopback only), a read-only system, the binds its policy
names, a private RAM-backed /tmp, an allow-listed environment and per-process limits. Nothing else exists for it.
"""
from .bwrap import INSTALL_HINT, SandboxUnavailable, bwrap_version
from .gpus import sandbox_gpus
from .policy import OFFLINE_ENV, Bind, Limits, SandboxPolicy, allowed_env
from .process import (SandboxError, SandboxedProcess, frozen, interrupt, interrupt_on_exit_signal, interrupted,
                      kill_all, sweep_leftovers)
from .write_watch import WriteWatch

__all__ = ["INSTALL_HINT", "OFFLINE_ENV", "Bind", "Limits", "SandboxError", "SandboxPolicy", "SandboxUnavailable",
           "SandboxedProcess", "allowed_env", "bwrap_version", "frozen", "interrupt",
           "interrupt_on_exit_signal", "interrupted", "kill_all", "sandbox_gpus", "sweep_leftovers", "WriteWatch"]
