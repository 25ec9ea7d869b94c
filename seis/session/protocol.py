"""The protocols' rules, as data: who a session's parent is, what it inherits, which peers it sees, and where a
fan-in leaves the engines it hands over. The flow only dispatches what these say."""
from __future__ import annotations

from pathlib import Path

from ..run_config import RunConfig
from ..workspace import PeerMaterial
from .lineage import ChainState, fan_in
from .resume import clear
from .rundir import RunDir
from .spec import SessionSpec


def initial_states(config: RunConfig, vanilla: str) -> dict[str, ChainState]:
    return {c: ChainState(c, vanilla) for c in config.chain_ids()}


def upstream_is_vanilla(config: RunConfig) -> bool:
    """Branching sessions all start from E0; chains start from their own latest session."""
    return config.protocol == "branching"


def session_spec(config: RunConfig, run: RunDir, vanilla: str, states: dict[str, ChainState],
                 peers: dict[str, tuple[PeerMaterial, ...]], session: int, chain: str) -> SessionSpec:
    index = config.chain_ids().index(chain)
    branching = config.protocol == "branching"
    state = ChainState(chain, vanilla) if branching else states[chain]
    mine = peers.get(chain, ())
    return SessionSpec(
        run_id=config.run_id, chain=chain,
        # branching sessions are all independent: spread them over the agent's exploration orders
        chain_index=session * config.chains + index if branching else index,
        session=session, parent_snapshot=state.snapshot, vanilla_snapshot=vanilla,
        session_dir=run.session_dir(chain, session), inherited=() if branching else state.reports,
        peers=mine, synced_from=tuple(p.chain for p in mine))


def sync_dir(run: RunDir, session: int) -> Path:
    return run.root / "syncs" / f"{session:03d}"


def gather_peers(store, run: RunDir, states: dict[str, ChainState], session: int):
    """A fan-in: every chain's latest retained engine restored under syncs/<session>/<chain>/ (what an
    interrupted attempt left there is replaced), and each chain handed all of its peers'."""
    root = sync_dir(run, session)
    clear(root)
    dirs = {c: store.get(s.snapshot, root / c) for c, s in states.items()}
    return fan_in(states, dirs)


def pin_vanilla(store, run: RunDir, base_engine: Path) -> str:
    """The run's vanilla snapshot: the one it recorded (a resumed run keeps judging against the E0 it started
    with, even if the checkout's engine_template/ changed since), else a new snapshot of `base_engine`."""
    recorded = run.recorded_vanilla()
    if recorded is not None and recorded in store:
        return recorded
    sid = store.put(base_engine, {"role": "vanilla"})
    run.record_vanilla(sid)
    return sid
