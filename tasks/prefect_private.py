"""Every use of Prefect's private API (modules and names that start with `_`), in one place: what a Prefect
upgrade may change without notice is here, and nowhere else in flows/, tasks/ or seis/.

Written against Prefect 3.9.1, the version pyproject.toml pins. After an upgrade, check each name here against the
new Prefect first: tests/test_cancel.py and tests/test_clean_failure.py exercise the GPU slot's lease,
tests/test_deployments.py and tests/test_scale_out.py the deployment schema.

- the GPU slot (tasks.gpu.gpu_slot): Prefect's public `concurrency()` cannot be stopped while it waits, so the slot
  is acquired by tasks.slot_wait and then held and given back as `concurrency()` does it, with these two;
- prefect.yaml and flows/session-deployments.yaml are checked with what `prefect deploy` reads them with (tests
  only; imported on use, the deploy CLI being heavy)."""
from __future__ import annotations

# Renews a lease in the background while open: maintain_concurrency_lease(lease_id, lease_duration,
# raise_on_lease_renewal_failure=False, suppress_warnings=False), a context manager.
from prefect.concurrency._leases import maintain_concurrency_lease
# Gives back the slot(s) a lease holds: release_concurrency_slots_with_lease(lease_id).
from prefect.concurrency._sync import release_concurrency_slots_with_lease

__all__ = ["maintain_concurrency_lease", "release_concurrency_slots_with_lease", "prefect_yaml_model",
           "deployment_schedule"]


def prefect_yaml_model():
    """The pydantic model `prefect deploy` reads prefect.yaml with (prefect.cli.deploy._models.PrefectYamlModel)."""
    from prefect.cli.deploy._models import PrefectYamlModel
    return PrefectYamlModel


def deployment_schedule(schedule_config: dict) -> dict:
    """What `prefect deploy` makes of one schedule entry of a deployment
    (prefect.cli.deploy._schedules._schedule_config_to_deployment_schedule)."""
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule
    return _schedule_config_to_deployment_schedule(schedule_config)
