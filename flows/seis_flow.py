"""The `seis` flow: chains of sessions under one of three protocols.

- branching:  every session starts from E0; the best passing engine is kept.
- chain:      each session inherits its chain's last retained engine and all of the chain's reports.
- sync-chain: as chain, plus a fan-in before every N-th session that hands each chain every peer's latest
              retained engine and reports; the agent decides what to adopt.

Chains run concurrently (sessions are submitted together each round); build + gate steps queue on the GPU limit.
With dispatch=workers each session is a `seis-session` flow run on a work pool instead (flows/session_flow.py,
started by tasks/dispatch.py): this flow then keeps only the protocol state, fan-ins hand over snapshot ids, and
engines move between hosts only through the snapshot store's DVC remote.

Parameters: every RunConfig field is a parameter of its own (`--param chains=2`), with RunConfig's description and
bounds (seis.session.params.run_param: a deployment's form shows them, the server refuses a value out of bounds),
on top of an optional whole `config` (a dict, or a RunConfig in-process); `resume=RUN_DIR` continues an
interrupted run from its recorded config, redoing only the sessions it had not finished. The rules (who inherits
what, what is finished, what is retained) and the round loop (seis.session.rounds) live in seis.session; this
module only dispatches them, as Prefect tasks (TaskSessions).
"""
from __future__ import annotations

import threading
from typing import Annotated, Optional

from prefect import flow, tags, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed
from prefect.utilities.annotations import quote

from flows.runtime import quiet_thread_timeout_notice
from seis.engine_import import ENGINE_TEMPLATE
from seis.run_config import RunConfig
from seis.sandbox import interrupt_on_exit_signal
from seis.session import ChainState, RunDir, SessionOutcome, SessionResult, session_spec, upstream_is_vanilla
from seis.session.dispatch import adopt_recorded, peer_refs, session_request
from seis.session.display import (postval_flags_line, rounded, run_label, run_tags, session_markdown,
                                  summary_artifact_markdown)
from seis.session.params import ParameterError, described, resolve_config, with_run_parameters
from seis.session.preflight import preflight_run
from seis.session.progress import best_record, pick_best_of_run, run_failure
from seis.session.status import REFUSED
from seis.session.protocol import gather_peers, pin_vanilla
from seis.session.resources import scratch
from seis.session.resume import clear, finished, keep_only
from seis.session.rounds import run_rounds
from seis.session.status import FINISHED_FAILED_NOTE
from seis.store import SnapshotStore
from seis.tables import printable
from tasks.artifacts import stable_key
from tasks.attempts import begin_attempt
from tasks.cancel import CancelWatch, is_marked
from tasks.cleanup import release_run
from tasks.dispatch import remote_session_task
from tasks.gpu import ensure_gpu_limit, registry
from tasks.postval import post_validate_task
from tasks.session import session_task

quiet_thread_timeout_notice()

RESUME_HINT = "the flow parameter resume={out} (CLI: seis evolve --resume {out})"
CONFIG_TEXT = "a whole run config (a mapping of the parameters below); each parameter given goes on top of it"
RESUME_TEXT = ("a run directory to continue (absolute path): its recorded config.json wins over every other "
               "parameter; only its unfinished sessions are redone")


class RunFailed(RuntimeError):
    pass


@task(name="snapshot-vanilla", task_run_name="snapshot-vanilla", cache_policy=NO_CACHE)
def snapshot_vanilla_task(config: RunConfig, run: RunDir) -> str:
    return pin_vanilla(SnapshotStore(config.store), run, config.base_engine or ENGINE_TEMPLATE)


@task(name="fan-in", task_run_name="s{session} fan-in", cache_policy=NO_CACHE)
def fan_in_task(config: RunConfig, states: dict[str, ChainState], session: int) -> dict:
    """Gather every chain's latest retained engine and reports; each chain gets all of its peers'. On workers, by
    reference (snapshot ids and reports): each session restores its peers' engines from the DVC remote."""
    if config.dispatch == "workers":
        return peer_refs(states)
    return gather_peers(SnapshotStore(config.store), RunDir(config.out), states, session)


@flow(name="seis", log_prints=True, on_cancellation=[release_run], on_crashed=[release_run])
@with_run_parameters
def seis(config: Annotated[Optional[RunConfig | dict], described(CONFIG_TEXT)] = None,
         resume: Annotated[Optional[str], described(RESUME_TEXT)] = None, **fields):
    """Run one SEIS evolution; returns the run directory (summary.parquet, summary.md, per-session files).

    Every parameter left unset takes `config`'s value, else RunConfig's default (each parameter's description says
    which). `resume`: a run directory to continue (its config.json wins over the other parameters; differing ones
    are logged as ignored).

    Task runs are named `c0/s1 <step>` and tagged `chain:c0`, `session:1`. Values go to tasks `quote()`d and the
    graph's edges are given explicitly (`wait_for`): a session waits for its chain's previous session (or the
    vanilla snapshot) and, after a sync point, for the fan-in; a fan-in waits for every chain's latest session."""
    from prefect import get_run_logger
    from prefect.runtime import flow_run

    logger = get_run_logger()
    try:
        resolved = resolve_config(config, fields, resume)
        run_config = resolved.config
        if run_config.dispatch == "workers":
            _check_workers_reachable(run_config)
        memory = preflight_run(run_config, resume=resolved.resume, resume_hint=RESUME_HINT)
    except (ParameterError, ValueError) as e:
        return Failed(message=f"{REFUSED}: {e}")
    if resolved.ignored:
        logger.warning("resuming %s with its recorded config; ignored: %s", run_config.out,
                       ", ".join(f"{k}={v!r}" for k, v in resolved.ignored.items()))
    logger.info("memory: %s", memory.describe() if memory else "checked by each worker before its session")
    ensure_gpu_limit()
    try:
        run = RunDir.open(run_config.out) if resolved.resume else RunDir.create(run_config.out,
                                                                               run_config.model_dump_json(indent=2))
    except ValueError as e:  # another run took the output dir since the checks above
        return Failed(message=f"{REFUSED}: {e}")
    try:
        lock = run.lock().__enter__()
    except TimeoutError:
        status = run.status()
        return Failed(message=f"{run.root} is in use by another flow (pid {status.pid if status else '?'}); "
                              f"wait for it or cancel it first")
    try:
        begin_attempt(run, str(flow_run.id), resolved.resume)  # a resume ends the attempt it continues, links it
        with CancelWatch(flow_run.id) as cancel:   # a cancellation stops the gates and sessions within seconds
            result = _run(run_config, run, resumed=resolved.resume, flow_run_id=str(flow_run.id))
        return cancel.end_run(run) if cancel.requested else result
    finally:
        lock.__exit__(None, None, None)


def _check_workers_reachable(config: RunConfig) -> None:
    """dispatch=workers needs a Prefect server (workers never see a temporary one) that knows the session
    deployment."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ValueError("dispatch=workers needs a Prefect server with workers on its pool: set PREFECT_API_URL "
                         "(README, 'Scale-out: sessions on GPU workers')")
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(config.session_deployment)
        except ObjectNotFound:
            raise ValueError(f"no deployment {config.session_deployment} on {PREFECT_API_URL.value()}: deploy it "
                             f"first (prefect deploy --prefect-file flows/session-deployments.yaml --name cuda)"
                             ) from None


def _run(config: RunConfig, run: RunDir, resumed: bool, flow_run_id: str):
    old = run.status()
    total = config.chains * config.sessions
    run.set_status("running", restart=True, flow_run_id=flow_run_id, sessions_total=total, message="",
                   resumes=(old.resumes + 1) if (resumed and old is not None) else 0)
    interrupted = False
    # The run's state is settled for whatever goes wrong once status.json says running: the scratch dir and the
    # registry entry too (a full /tmp, an unwritable PREFECT_HOME) failed the run while it kept reading running.
    try:
        with scratch(run.root) as scratch_root:
            registry().add_run(flow_run_id, run.root, scratch_root)
            with interrupt_on_exit_signal():   # a gate in flight ends now, not when Prefect's threads are joined
                vanilla, outcomes, failures = _sessions(config, run, resumed)
            if failures:
                message = printable("; ".join(failures))  # can quote an engine's or an agent's words
                _set_failed(run, flow_run_id, sessions_done=run.sessions_recorded(), message=message)
                print(f"run stopped: {message}")
                return Failed(message=f"{message} (the finished sessions are recorded; continue with "
                                      f"{RESUME_HINT.format(out=run.root)})")
            failure = run_failure(outcomes)  # every session finished, yet nothing was judged: after the artifacts
            result, flagged = _finish(config, run, vanilla, outcomes, failure)
            if failure:
                _set_failed(run, flow_run_id, sessions_done=len(outcomes), message=failure,
                            note=FINISHED_FAILED_NOTE)
                print(f"run failed: {failure}")
                return Failed(message=failure)
            run.set_status("complete", flow_run_id=flow_run_id, sessions_done=len(outcomes), message=flagged)
            return result
    except Exception as e:
        _set_failed(run, flow_run_id, sessions_done=run.sessions_recorded(), message=f"{type(e).__name__}: {e}")
        raise
    except BaseException as e:  # interrupted (SIGTERM, Ctrl-C): the run is resumable
        run.set_status("crashed", flow_run_id=flow_run_id, sessions_done=run.sessions_recorded(),
                       message=f"interrupted ({type(e).__name__})")
        interrupted = True      # its registry entry is left to the flow's hooks: a cancellation says so there
        raise
    finally:
        if not interrupted:
            registry().drop_run(flow_run_id)


def _set_failed(run: RunDir, flow_run_id: str, **values) -> None:
    """status.json `failed`, unless the run's cancellation was seen first: then its sessions failed because their
    engines were killed, and CancelWatch.end_run writes `cancelled` (a run's first end written stands: status.py)."""
    if not is_marked(flow_run_id):
        run.set_status("failed", flow_run_id=flow_run_id, **values)


def _sessions(config: RunConfig, run: RunDir, resumed: bool):
    """The protocol's rounds (seis.session.rounds) with Prefect task runs; recorded sessions (resume) are not
    redone."""
    done = run_rounds(config, TaskSessions(config, run), resumed)
    return done.vanilla, done.outcomes, done.failures


class TaskSessions:
    """The round loop's SessionRunner: each session, fan-in and the vanilla snapshot a Prefect task run (on workers,
    a session is a `seis-session` flow run). The graph's edges are given explicitly: a session waits for its
    chain's previous session (branching: the vanilla snapshot) and its round's fan-in; a fan-in waits for every
    chain's latest session."""

    def __init__(self, config: RunConfig, run: RunDir):
        self.config, self.run = config, run
        self.store = SnapshotStore(config.store)
        self.vanilla_future = None
        self.latest = {}          # each chain's last task run: its lineage
        self.fan_ins = {}         # session -> its fan-in's task run

    def pin_vanilla(self) -> str:
        self.vanilla_future = snapshot_vanilla_task.submit(quote(self.config), quote(self.run))
        self.latest = {c: self.vanilla_future for c in self.config.chain_ids()}
        return _result(self.vanilla_future)

    def recorded(self, chain: str, session: int):
        session_dir = self.run.session_dir(chain, session)
        if self.config.dispatch == "workers":
            adopt_recorded(self.store, session_dir)
        return finished(session_dir, self.store)

    def keep_only(self, kept: set[tuple[str, int]]) -> None:
        keep_only(self.run.root, kept)

    def fan_in(self, states: dict[str, ChainState], session: int):
        with tags(*run_tags(session=session), "fan-in"):
            self.fan_ins[session] = fan_in_task.submit(quote(self.config), quote(states), session,
                                                       wait_for=list(self.latest.values()))
        return _result(self.fan_ins[session])

    def run_sessions(self, session: int, chains: list[str], vanilla: str, states: dict[str, ChainState],
                     peers) -> dict[str, SessionResult]:
        config, run = self.config, self.run
        futures = {}
        for chain in chains:
            clear(run.session_dir(chain, session))    # what an interrupted attempt left: redone from its parent
            upstream = [self.vanilla_future] if upstream_is_vanilla(config) else [self.latest[chain]]
            after = upstream + [f for f in (self.fan_ins.get(session),) if f]
            with tags(*run_tags(chain, session)):
                if config.dispatch == "workers":      # the same protocol rules, the session on a worker
                    request = session_request(config, run, self.store, vanilla, states, peers, session, chain)
                    futures[chain] = remote_session_task.submit(quote(request), config.session_deployment,
                                                                quote(config.store), wait_for=after)
                else:
                    spec = session_spec(config, run, vanilla, states, peers, session, chain)
                    futures[chain] = session_task.submit(quote(config), quote(spec), quote(config.store),
                                                         wait_for=after)
        _wait_all(list(futures.values()))
        self.latest.update(futures)
        results = {}
        for chain, future in futures.items():
            try:
                results[chain] = future.result()
            except Exception as e:  # a bug or an orchestration failure: its traceback is in the task's log
                results[chain] = SessionResult(chain, session,
                                               failure=f"{run_label(chain, session)}: {type(e).__name__}: {e}")
        return results

    def show_recorded(self, outcome: SessionOutcome) -> None:
        _recorded_artifact(outcome, self.run)
        print(f"[{outcome.chain} s{outcome.session}] recorded by an earlier attempt: {outcome.verdict} "
              f"({outcome.snapshot})")


WAKE_S = 1.0  # how often the flow's main thread, waiting for its task runs, comes back to run signal handlers


def _wait_all(futures: list) -> None:
    """Until every future is done, the main thread waking every WAKE_S. Python runs a signal's handler (Ctrl-C,
    SIGTERM: kill the engines, end the run) only in the main thread, between bytecodes; when the kernel hands the
    signal to another of the process's threads, a main thread blocked in an untimed wait never gets to it, and
    the run waits for its gates to end on their own."""
    if not futures:
        return
    left, lock, all_done = len(futures), threading.Lock(), threading.Event()

    def one_done(_future) -> None:
        nonlocal left
        with lock:
            left -= 1
            if left == 0:
                all_done.set()

    for future in futures:
        future.add_done_callback(one_done)
    while not all_done.wait(WAKE_S):
        pass
    for future in futures:
        future.wait()  # done: records its final state at once


def _result(future):
    _wait_all([future])
    return future.result()


def _recorded_artifact(outcome, run: RunDir) -> None:
    """A session finished by an earlier attempt shows in this flow run as it did there."""
    from seis.evaluator import GateResult, render_gate_for_agents

    session_dir = run.session_dir(outcome.chain, outcome.session)
    gate_file = session_dir / "gate.json"
    measurements = ""
    if gate_file.is_file():
        try:
            measurements = render_gate_for_agents(GateResult.model_validate_json(gate_file.read_text()))
        except ValueError:
            pass
    create_markdown_artifact(session_markdown(outcome, measurements, session_dir),
                             key=stable_key("session", outcome.chain, f"s{outcome.session}"),
                             description=f"SEIS session {outcome.chain}/s{outcome.session} of run "
                                         f"{run.root.name}: {outcome.verdict} (recorded)")


def _finish(config: RunConfig, run: RunDir, vanilla: str, outcomes, failure: str | None = None) -> tuple[str, str]:
    """Summary, figures, best.json, post-validation and artifacts; returns the run directory and what the
    post-validation flagged about the best engine ('' if nothing)."""
    rows = [o.summary_row() for o in outcomes]
    run.write_summary(rows)
    figure = run.write_chain_figure()
    run.write_timeline()
    best, best_within_noise = pick_best_of_run(run.root, outcomes, config.objective)  # noise: ranked 1.0x
    run.write_best(best_record(best, best_within_noise))
    flagged = ""
    if config.post_validate != "off" and best is not None:
        postval_dir = run.root / "postval"
        clear(postval_dir)                       # an interrupted post-validation is redone whole
        checked = post_validate_task(quote(config), quote(best.snapshot), quote(vanilla),
                                     quote(best.dev_speedup_vs_vanilla), quote(postval_dir))
        # Its flags (accuracy beyond bounds, timed outputs that disagree with vanilla's, a cut context) were only in
        # postval/ files: the run said complete and named its best engine with no word of them.
        flagged = postval_flags_line(best.snapshot, checked.get("flags") or [], postval_dir)
        if flagged:
            print(flagged)
    summary_md = (run.root / "summary.md").read_text()
    create_markdown_artifact(summary_artifact_markdown(config.run_id, config.protocol, run.root, summary_md, figure,
                                                       best, best_within_noise, failure, flagged),
                             key=stable_key("summary"), description=f"SEIS {config.protocol} run {config.run_id}")
    create_table_artifact([rounded(r) for r in rows], key=stable_key("sessions"),
                          description=f"SEIS {config.protocol} run {config.run_id}: one row per session")
    print(summary_md)
    return str(run.root), flagged
