"""The `seis` flow: chains of sessions under one of three protocols.

- branching:  every session starts from E0; the best passing engine is kept.
- chain:      each session inherits its chain's last retained engine and all of the chain's reports.
- sync-chain: as chain, plus a fan-in before every N-th session that hands each chain every peer's latest
              retained engine and reports; the agent decides what to adopt.

Chains run concurrently (sessions are submitted together each round); build + gate steps queue on the GPU limit.
"""
from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from seis.config import RunConfig
from seis.engine_import import ENGINE_TEMPLATE
from seis.session import ChainState, RunDir, SessionSpec, fan_in, pick_best
from seis.store import SnapshotStore
from tasks.gpu import ensure_gpu_limit
from tasks.postval import post_validate_task
from tasks.session import session_task


@task(name="snapshot-vanilla", cache_policy=NO_CACHE)
def snapshot_vanilla_task(config: RunConfig) -> str:
    return SnapshotStore(config.store).put(config.base_engine or ENGINE_TEMPLATE, {"role": "vanilla"})


@task(name="fan-in", cache_policy=NO_CACHE)
def fan_in_task(config: RunConfig, states: dict[str, ChainState], session: int) -> dict:
    """Gather every chain's latest retained engine and reports; each chain gets all of its peers'."""
    store = SnapshotStore(config.store)
    sync_dir = RunDir(config.out).root / "syncs" / f"{session:03d}"
    dirs = {c: store.get(s.snapshot, sync_dir / c) for c, s in states.items()}
    return fan_in(states, dirs)


@flow(name="seis", log_prints=True)
def seis(config: RunConfig) -> str:
    """Run one SEIS evolution; returns the run directory (summary.parquet, summary.md, per-session files)."""
    config.preflight()
    ensure_gpu_limit()
    run = RunDir.create(config.out, config.model_dump_json(indent=2))
    vanilla = snapshot_vanilla_task(config)
    states = {c: ChainState(c, vanilla) for c in config.chain_ids()}
    outcomes = []
    for session in range(config.sessions):
        peers = fan_in_task(config, states, session) if config.is_sync_point(session) else {}
        futures = []
        for index, chain in enumerate(config.chain_ids()):
            state = states[chain] if config.protocol != "branching" else ChainState(chain, vanilla)
            # branching sessions are all independent: spread them over the agent's exploration orders
            explore = index if config.protocol != "branching" else session * config.chains + index
            spec = SessionSpec(
                run_id=config.run_id, chain=chain, chain_index=explore, session=session,
                parent_snapshot=state.snapshot, vanilla_snapshot=vanilla, session_dir=run.session_dir(chain, session),
                inherited=state.reports if config.protocol != "branching" else (),
                peers=peers.get(chain, ()), synced_from=tuple(p.chain for p in peers.get(chain, ())))
            futures.append(session_task.submit(config, spec, config.store))
        for future in futures:
            outcome = future.result()
            outcomes.append(outcome)
            states[outcome.chain] = states[outcome.chain].after(outcome)
    rows = [o.summary_row() for o in outcomes]
    run.write_summary(rows)
    run.write_chain_figure()
    best = pick_best(outcomes)
    run.write_best(best.summary_row() if best else None)
    if config.post_validate != "off" and best is not None:
        post_validate_task(config, best.snapshot, vanilla, best.dev_speedup_vs_vanilla, run.root / "postval")
    create_table_artifact(rows, key=f"seis-{config.run_id}".lower().replace("_", "-"),
                          description=f"SEIS {config.protocol} run {config.run_id}")
    print((run.root / "summary.md").read_text())
    return str(run.root)
