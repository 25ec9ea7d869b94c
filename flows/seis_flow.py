"""The `seis` flow: chains of sessions under one of three protocols.

- branching:  every session starts from E0; the best passing engine is kept.
- chain:      each session inherits its chain's last retained engine and all of the chain's reports.
- sync-chain: as chain, plus a fan-in before every N-th session that hands each chain every peer's latest
              retained engine and reports; the agent decides what to adopt.

Chains run concurrently (sessions are submitted together each round); build + gate steps queue on the GPU limit.
"""
from __future__ import annotations

from prefect import flow, tags, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from seis.config import RunConfig
from seis.engine_import import ENGINE_TEMPLATE
from seis.session import ChainState, RunDir, SessionSpec, fan_in, pick_best
from seis.session.display import rounded, run_tags, summary_artifact_markdown
from seis.store import SnapshotStore
from tasks.artifacts import stable_key
from tasks.gpu import ensure_gpu_limit
from tasks.postval import post_validate_task
from tasks.session import session_task


@task(name="snapshot-vanilla", task_run_name="snapshot-vanilla", cache_policy=NO_CACHE)
def snapshot_vanilla_task(config: RunConfig) -> str:
    return SnapshotStore(config.store).put(config.base_engine or ENGINE_TEMPLATE, {"role": "vanilla"})


@task(name="fan-in", task_run_name="s{session} fan-in", cache_policy=NO_CACHE)
def fan_in_task(config: RunConfig, states: dict[str, ChainState], session: int) -> dict:
    """Gather every chain's latest retained engine and reports; each chain gets all of its peers'."""
    store = SnapshotStore(config.store)
    sync_dir = RunDir(config.out).root / "syncs" / f"{session:03d}"
    dirs = {c: store.get(s.snapshot, sync_dir / c) for c, s in states.items()}
    return fan_in(states, dirs)


@flow(name="seis", log_prints=True)
def seis(config: RunConfig) -> str:
    """Run one SEIS evolution; returns the run directory (summary.parquet, summary.md, per-session files).

    Task runs are named `c0/s1 <step>` and tagged `chain:c0`, `session:1`. Values go to tasks `quote()`d and the
    graph's edges are given explicitly (`wait_for`): a session waits for its chain's previous session (or the
    vanilla snapshot) and, after a sync point, for the fan-in; a fan-in waits for every chain's latest session."""
    config.preflight()
    ensure_gpu_limit()
    run = RunDir.create(config.out, config.model_dump_json(indent=2))
    vanilla_future = snapshot_vanilla_task.submit(quote(config))
    vanilla = vanilla_future.result()
    states = {c: ChainState(c, vanilla) for c in config.chain_ids()}
    latest = {c: vanilla_future for c in config.chain_ids()}     # each chain's last task run: its lineage
    outcomes, done = [], {}
    for session in range(config.sessions):
        peers, fan_in_future = {}, None
        if config.is_sync_point(session):
            with tags(*run_tags(session=session), "fan-in"):
                fan_in_future = fan_in_task.submit(quote(config), quote(states), session,
                                                   wait_for=list(latest.values()))
            peers = fan_in_future.result()
        futures = {}
        for index, chain in enumerate(config.chain_ids()):
            state = states[chain] if config.protocol != "branching" else ChainState(chain, vanilla)
            # branching sessions are all independent: spread them over the agent's exploration orders
            explore = index if config.protocol != "branching" else session * config.chains + index
            spec = SessionSpec(
                run_id=config.run_id, chain=chain, chain_index=explore, session=session,
                parent_snapshot=state.snapshot, vanilla_snapshot=vanilla, session_dir=run.session_dir(chain, session),
                inherited=state.reports if config.protocol != "branching" else (),
                peers=peers.get(chain, ()), synced_from=tuple(p.chain for p in peers.get(chain, ())))
            upstream = [vanilla_future] if config.protocol == "branching" else [latest[chain]]
            with tags(*run_tags(chain, session)):
                futures[chain] = session_task.submit(quote(config), quote(spec), quote(config.store),
                                                     wait_for=upstream + [f for f in (fan_in_future,) if f])
        for chain, future in futures.items():
            outcome = future.result()
            outcomes.append(outcome)
            done[(chain, session)] = future
            states[chain] = states[chain].after(outcome)
        latest.update(futures)
    rows = [o.summary_row() for o in outcomes]
    run.write_summary(rows)
    figure = run.write_chain_figure()
    best = pick_best(outcomes)
    run.write_best(best.summary_row() if best else None)
    if config.post_validate != "off" and best is not None:
        post_validate_task(quote(config), quote(best.snapshot), quote(vanilla), quote(best.dev_speedup_vs_vanilla),
                           quote(run.root / "postval"), wait_for=[done[(best.chain, best.session)]])
    summary_md = (run.root / "summary.md").read_text()
    create_markdown_artifact(summary_artifact_markdown(config.run_id, config.protocol, run.root, summary_md, figure,
                                                       best),
                             key=stable_key("summary"), description=f"SEIS {config.protocol} run {config.run_id}")
    create_table_artifact([rounded(r) for r in rows], key=stable_key("sessions"),
                          description=f"SEIS {config.protocol} run {config.run_id}: one row per session")
    print(summary_md)
    return str(run.root)
