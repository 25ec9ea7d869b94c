"""One session run through tasks/session.py's session task in-process, for tests that fake its agent and gate."""
from __future__ import annotations

from pathlib import Path

from seis.engine_import import ENGINE_TEMPLATE
from seis.run_config import RunConfig
from seis.session import SessionSpec


def first_session(tmp_path: Path, store) -> tuple[RunConfig, SessionSpec]:
    """A smoke-gate run config on tiny-qwen3 and its chain c0's session 0, whose parent is E0 (put in `store`)."""
    vanilla = store.put(ENGINE_TEMPLATE)
    config = RunConfig(model="tiny-qwen3", device="cpu", gate="smoke", out=tmp_path / "run", store=store.root)
    spec = SessionSpec(run_id="r", chain="c0", chain_index=0, session=0, parent_snapshot=vanilla,
                       session_dir=tmp_path / "run" / "chains" / "c0" / "000", vanilla_snapshot=vanilla)
    return config, spec
