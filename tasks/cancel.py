"""Cancelling a run, from the Prefect UI or `prefect flow-run cancel`, stops it within seconds.

A flow run executed in-process (`seis evolve`, the Python API) has no worker to act on a cancellation, and one on
a worker is only sent SIGTERM once its worker notices. So both SEIS flows watch their own state (`CancelWatch`):
once it is Cancelling, the watcher kills every engine sandbox and dev-benchmark process group of the process and
starts none any more, asks for the run's child session flow runs (dispatch=workers) to be cancelled, and gives back
the run's GPU slot leases; the flow body then ends with a Cancelled state. Independently of any watcher, a gate
asks before and while it waits for its slot whether its run is being cancelled (`refuse_if_cancelled`, in
tasks.cancelled), so no queued gate of a cancelled run ever takes a slot."""
from __future__ import annotations

import contextvars
import logging
import threading

from . import flow_runs
from .cancelled import RunCancelled, is_marked, mark_cancelled, refuse_if_cancelled  # noqa: F401 (re-exported)

POLL_S = 1.0            # how often a running flow looks at its own state


def stop_run(flow_run_id, logger: logging.Logger | None = None) -> None:
    """Everything this process does for a cancelled flow run ends now: its engines and dev benchmarks are killed
    and no new one starts, its child session flow runs are cancelled and its GPU slot leases released."""
    from seis.sandbox import interrupt

    from .gpu import release_flow_run
    logger = logger or logging.getLogger("seis.cancel")
    mark_cancelled(flow_run_id)
    engines = interrupt()
    try:
        children = flow_runs.cancel_children(flow_run_id, f"its parent flow run {flow_run_id} was cancelled")
    except Exception as e:  # noqa: BLE001 - the slots and engines matter more; the hooks try again
        children = []
        logger.warning("could not cancel the child flow runs: %s", e)
    released = release_flow_run(str(flow_run_id), logger)
    logger.info("cancelled: %d engine sandbox(es) killed, %d GPU slot lease(s) released, child flow runs "
                "cancelled: %s", engines, released, ", ".join(children) or "none")


class CancelWatch:
    """Around a flow's body: a thread looks at the flow run's state every POLL_S seconds and stops the run
    (`stop_run`) once it is being cancelled. After the body, `requested` says whether it was; an ordinary
    exception the body raised because its work was killed under it is then swallowed (the flow ends Cancelled,
    not Failed); a KeyboardInterrupt or Prefect's termination signal goes through."""

    def __init__(self, flow_run_id, poll_s: float = POLL_S):
        self.flow_run_id, self.poll_s = str(flow_run_id), poll_s
        self._done = threading.Event()
        self._stopped = threading.Lock()   # taken once, by whoever stops the run first
        # in the flow's context: its Prefect settings (server, home) and run logger hold there too
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._watch,),
                                        name="seis-cancel-watch", daemon=True)
        self.logger = flow_runs.run_logger("seis.cancel")

    @property
    def requested(self) -> bool:
        return is_marked(self.flow_run_id)

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            try:
                if self.requested or flow_runs.stopping(flow_runs.read(self.flow_run_id)):
                    self._stop()
                    return
            except Exception:  # noqa: BLE001 - a server that does not answer now may answer at the next look
                continue

    def _stop(self) -> None:
        if self._stopped.acquire(blocking=False):
            self.logger.warning("the flow run is being cancelled: stopping its gates, engines and sessions")
            stop_run(self.flow_run_id, self.logger)

    def __enter__(self) -> "CancelWatch":
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._done.set()
        self._thread.join()
        if self.requested:  # seen first by a gate asking for its slot: the sessions still end with the run
            self._stop()
        return self.requested and exc_type is not None and issubclass(exc_type, Exception)

    def cancelled_state(self, what: str):
        """The state a cancelled flow ends in (Cancelling may only become Cancelled); its unfinished task runs end
        Cancelled too."""
        from prefect.states import Cancelled
        message = f"{what} was cancelled"
        try:
            flow_runs.end_task_runs(self.flow_run_id, cancelled=True, message=message)
        except Exception as e:  # noqa: BLE001 - the state matters more than the UI's task runs
            self.logger.warning("could not end the flow run's unfinished task runs: %s", e)
        return Cancelled(message=message)

    def end_run(self, run):
        """A cancelled `seis` run: its status says so (a resume continues it), and its flow run ends Cancelled. A
        cancellation seen only after the run had ended, or by another attempt than the run's, leaves its status as
        it is (status.py)."""
        status = run.set_status("cancelled", flow_run_id=self.flow_run_id, sessions_done=run.sessions_recorded(),
                                message="the flow run was cancelled; its gates and sessions were stopped")
        if status.state != "cancelled":
            self.logger.warning("the cancellation came after the run had ended (or another attempt had started it): "
                                "status.json stays %s", status.state)
        return self.cancelled_state(f"the run in {run.root}")
