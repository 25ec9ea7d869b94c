"""Artifact keys that stay the same from run to run of one deployment (`seis-sync-chain-summary`; `seis-summary`
for a local run), so Prefect's per-key history compares runs."""
from __future__ import annotations

from seis.session.display import artifact_key, stable_prefix


def stable_key(*parts: object) -> str:
    from prefect.runtime import deployment, flow_run
    return artifact_key(stable_prefix(flow_run.flow_name, deployment.name), *parts)
