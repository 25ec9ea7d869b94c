"""Whether a flow run is being cancelled, as this process knows it (a mark set once it is seen) and as the server
says: `refuse_if_cancelled` keeps a cancelled run from starting anything more, and a gate waiting for its GPU slot
asks it between attempts (tasks.slot_wait). Stopping what a cancelled run is doing is tasks.cancel's."""
from __future__ import annotations

import threading

from . import flow_runs


class RunCancelled(RuntimeError):
    """The flow run is being cancelled (or has ended, or its process is interrupted): nothing more starts for it."""


_cancelled: set[str] = set()   # flow runs of this process known to be cancelled
_lock = threading.Lock()


def mark_cancelled(flow_run_id) -> None:
    with _lock:
        _cancelled.add(str(flow_run_id))


def is_marked(flow_run_id) -> bool:
    with _lock:
        return str(flow_run_id) in _cancelled


def refuse_if_cancelled(flow_run_id, ask_server: bool = True) -> None:
    """Raise RunCancelled when this process is interrupted or the flow run is cancelled (asking the server unless
    this process already knows, or ask_server is False). A server that does not answer refuses nothing."""
    from seis.sandbox import interrupted
    if flow_run_id is not None and not is_marked(flow_run_id) and ask_server:
        try:
            if flow_runs.stopping(flow_runs.read(flow_run_id)):
                mark_cancelled(flow_run_id)
        except Exception:  # noqa: BLE001 - a server that does not answer is no cancellation
            pass
    if flow_run_id is not None and is_marked(flow_run_id):
        raise RunCancelled(f"the flow run {flow_run_id} is cancelled: nothing more is started for it")
    if interrupted():
        raise RunCancelled("this process is being interrupted: nothing more is started for its run")
