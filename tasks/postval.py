"""Post-validation of a run's best retained engine, outside the agents' feedback."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from seis.postval import make_config, run_post_validation
from seis.run_config import RunConfig
from seis.store import SnapshotStore

from .artifacts import stable_key
from .gpu import gpu_slot


@task(name="post-validate", task_run_name="post-validate {snapshot}", cache_policy=NO_CACHE)
def post_validate_task(config: RunConfig, snapshot: str, vanilla: str, dev_speedup: float | None,
                       out_dir: Path) -> dict:
    store = SnapshotStore(config.store)  # both engines from the store: what was retained, against the run's vanilla
    engine_dir, vanilla_dir = store.get(snapshot, out_dir / "engine"), store.get(vanilla, out_dir / "vanilla")
    pv_config = make_config(engine_dir=engine_dir, vanilla_dir=vanilla_dir, model=config.model, device=config.device,
                            out_dir=out_dir, quick=config.post_validate == "quick", reported_dev_speedup=dev_speedup)
    with gpu_slot():
        result = run_post_validation(pv_config)
    tables = "\n\n".join((out_dir / f"{name}.md").read_text() for name in ("accuracy", "speed", "latency"))
    create_markdown_artifact(f"# Post-validation of snapshot {snapshot}\n\n{tables}\n\nFiles: `{out_dir}`",
                             key=stable_key("postval"),
                             description=f"SEIS post-validation of {snapshot} (run {config.run_id})")
    return {"snapshot": snapshot, "flags": result.flags, "files": result.files}
