"""Errors that stop a gate before any verdict: they are about the inputs or the evaluator, not the candidate."""
from __future__ import annotations


class GateInputError(ValueError):
    """Bad input (missing or unsafe candidate dir, unknown model, workloads not prepared); the CLI exits 2."""


class ReferenceFailure(RuntimeError):
    """The trusted reference engine failed: the gate cannot judge anything, so it gives no verdict."""


class HostFailure(RuntimeError):
    """The host, not the engine code, ended an engine (the kernel's OOM killer: SIGKILL with no error of the
    engine's own): no verdict is reached, and it is never a candidate's failed check."""


class GateInterrupted(HostFailure):
    """The run was interrupted while this gate ran: its engines were killed, so it has no verdict."""


class ReferenceEngineFailure(ReferenceFailure):
    """The reference engine itself failed a call (an error, a crash, a timeout, a malformed reply), as opposed to
    the gate finding the reference's tree changed or processes left over. Beside untrusted engines that may be their
    doing (a candidate holding the GPU's memory): the gate replays the reference's calls alone to tell."""
