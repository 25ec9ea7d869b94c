"""What the first two rounds of the tests' sync-chain runs must show, wherever their sessions ran (in-process or on
workers): 2 chains, a fan-in before session 1, the offline agent with at least two library entries, smoke gates
on tiny-qwen3."""
from __future__ import annotations

import pandas as pd

from seis.engine_import import ENGINE_TEMPLATE
from seis.workspace import tree_hash


def check_sync_chain_lineage(df: pd.DataFrame, id_len: int = 16) -> None:
    vanilla = tree_hash(ENGINE_TEMPLATE)[:id_len]   # a snapshot id is the first id_len digits of its tree hash
    assert {("c0", 0), ("c0", 1), ("c1", 0), ("c1", 1)} <= set(zip(df.chain, df.session)), df
    s0 = df[df.session == 0].set_index("chain")
    s1 = df[df.session == 1].set_index("chain")
    # session 0: both chains start from E0 and explore different transformations
    assert set(s0.parent_snapshot) == {vanilla}
    assert s0.retained.all() and set(s0.verdict) == {"pass"}
    assert s0.loc["c0", "applied"] != s0.loc["c1", "applied"]
    # session 1 follows a sync: each chain inherits its own retained engine and adopts what its peer retained
    for chain, peer in (("c0", "c1"), ("c1", "c0")):
        assert s1.loc[chain, "parent_snapshot"] == s0.loc[chain, "snapshot"]
        assert s1.loc[chain, "synced_from"] == peer
        assert s1.loc[chain, "adopted"] == s0.loc[peer, "applied"]
    # both chains then hold the same engine (both transformations), each gated
    assert s1.loc["c0", "snapshot"] == s1.loc["c1", "snapshot"]
    assert not set(s1.verdict) & {"error", "no_change"}, s1.verdict
