"""prefect.yaml: every deployment loads, fits its machine, runs one at a time, is scheduled apart from the others
(paused until a user resumes it) and carries parameters that the flow itself accepts; the flow's parameter schema
describes and bounds every parameter as RunConfig does (no server needed)."""
from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import itertools
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
MIN_GAP = dt.timedelta(minutes=60)  # between any two deployments' scheduled starts


def _spec() -> dict:
    return yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text(encoding="utf-8"))


def _deployments() -> dict[str, dict]:
    return {d["name"]: d for d in _spec()["deployments"]}


@pytest.fixture(scope="module")
def flows() -> dict:
    """entrypoint -> the Prefect flow object it names, loaded the way a worker loads it."""
    from prefect.flows import load_flow_from_entrypoint
    loaded = {}
    for d in _deployments().values():
        if d["entrypoint"] not in loaded:
            path, _, func = d["entrypoint"].partition(":")
            loaded[d["entrypoint"]] = load_flow_from_entrypoint(f"{REPO_ROOT / path}:{func}")
    return loaded


def test_prefect_yaml_matches_the_installed_prefect_schema():
    from prefect.cli.deploy._models import PrefectYamlModel
    model = PrefectYamlModel.model_validate(_spec())
    assert {d.name for d in model.deployments} == set(_deployments())
    assert {"branching", "chain", "sync-chain", "cpu-smoke"} <= set(_deployments())


def test_every_entrypoint_is_the_seis_flow(flows):
    for name, d in _deployments().items():
        path, _, func = d["entrypoint"].partition(":")
        assert (REPO_ROOT / path).is_file() and func, name
        assert flows[d["entrypoint"]].name == "seis", name


def test_every_deployment_runs_one_at_a_time_and_queues_the_rest():
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    for name, d in _deployments().items():
        limit = d.get("concurrency_limit")
        assert isinstance(limit, dict), f"{name}: concurrency_limit must name a limit and a collision strategy"
        config = ConcurrencyLimitConfig(**limit)  # what the server stores
        assert config.limit == 1 and config.collision_strategy == ConcurrencyLimitStrategy.ENQUEUE, name


def _starts(schedule: dict, days: int = 7) -> list[dt.datetime]:
    from prefect.server.schemas.schedules import CronSchedule
    start = dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc)  # a Monday
    cron = CronSchedule(cron=schedule["cron"], timezone=schedule.get("timezone", "UTC"))
    dates = asyncio.run(cron.get_dates(n=100, start=start, end=start + dt.timedelta(days=days)))
    return [d.astimezone(dt.timezone.utc) for d in dates]


def test_schedules_are_staggered():
    starts = {}
    for name, d in _deployments().items():
        assert d.get("schedules"), f"{name} has no schedule"
        assert all("cron" in s and s.get("timezone") for s in d["schedules"]), f"{name}: cron with a timezone"
        starts[name] = [t for s in d["schedules"] for t in _starts(s)]
        assert starts[name], f"{name} never runs in a week"
    for (a, ta), (b, tb) in itertools.combinations(starts.items(), 2):
        gap = min(abs(x - y) for x in ta for y in tb)
        assert gap >= MIN_GAP, f"{a} and {b} start only {gap} apart"


def test_deployments_fit_their_machine():
    deployments = _deployments()
    pools = {}
    for name, d in deployments.items():
        device = d["parameters"].get("device")
        assert device in ("cuda", "cpu"), f"{name}: say which machine it is for (device: cuda or cpu)"
        pools.setdefault(device, set()).add(d["work_pool"]["name"])
        assert d.get("description", "").startswith("GPU host" if device == "cuda" else "CPU machine"), name
    assert pools["cuda"].isdisjoint(pools["cpu"]), "a CPU worker must never pick up a GPU deployment"
    cpu = deployments["cpu-smoke"]["parameters"]
    assert cpu["gate"] == "smoke" and cpu["model"] in ("tiny-qwen3", "smollm2-135m-instruct")
    for name in ("branching", "chain", "sync-chain"):
        assert deployments[name]["parameters"]["gate"] == "full", name


def test_parameters_validate_against_the_flow_signature(flows):
    from prefect.utilities.schema_tools import validate

    from seis.config import RunConfig
    for name, d in _deployments().items():
        flow, params = flows[d["entrypoint"]], d["parameters"]
        accepted = set(inspect.signature(flow.fn).parameters)
        assert set(params) <= accepted, f"{name}: {sorted(set(params) - accepted)} are not parameters of the flow"
        # What the server enforces on `prefect deployment run --param ...`, then what the flow run itself does.
        validate(params, flow.parameters.model_dump(), raise_on_error=True, ignore_required=True)
        flow.validate_parameters(params)
        config = RunConfig(**params)  # the same cross-field checks as `seis evolve`
        assert config.protocol == (name if name != "cpu-smoke" else "sync-chain")
    assert RunConfig(**_deployments()["sync-chain"]["parameters"]).sync_every == 3   # Sync-3


def _refused(flow, params: dict) -> bool:
    """Whether the server's schema check, the flow's own validation or RunConfig refuses params."""
    from prefect.utilities.schema_tools import validate

    from seis.config import RunConfig
    checks = (lambda: validate(params, flow.parameters.model_dump(), raise_on_error=True, ignore_required=True),
              lambda: flow.validate_parameters(params), lambda: RunConfig(**params))
    for check in checks:
        try:
            check()
        except Exception:  # noqa: BLE001 - any refusal counts
            return True
    return False


def test_a_bad_override_is_refused(flows):
    """The checks above can fail: a wrong type, a value outside the choices, an inconsistent pair and an unknown
    name are refused; a good single override is not."""
    d = _deployments()["cpu-smoke"]
    flow = flows[d["entrypoint"]]
    assert not _refused(flow, {**d["parameters"], "chains": 3})
    for bad in ({"chains": "many"}, {"gate": "enormous"}, {"sync_every": 5}, {"nope": 1}):
        assert _refused(flow, {**d["parameters"], **bad}), bad


def test_sessions_alone_can_be_overridden(flows):
    """sync_every follows sessions unless given: `--param sessions=1` (or 2) alone is a valid run everywhere."""
    for name, d in _deployments().items():
        for sessions in (1, 2, 3, 100):
            assert not _refused(flows[d["entrypoint"]], {**d["parameters"], "sessions": sessions}), (name, sessions)


def test_an_inconsistent_sync_every_is_refused_in_one_line():
    from seis.session.params import ParameterError, resolve_config
    with pytest.raises(ParameterError) as refused:
        resolve_config(None, {**_deployments()["sync-chain"]["parameters"], "sessions": 2, "sync_every": 3})
    assert "\n" not in str(refused.value) and "leave sync_every unset" in str(refused.value)


def test_schedules_start_paused():
    """What `prefect deploy` makes of each schedule: inactive, so nothing runs before a user resumes it."""
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule
    for name, d in _deployments().items():
        for schedule in d["schedules"]:
            assert _schedule_config_to_deployment_schedule(schedule).get("active") is False, name


def _parameter_schema(flow) -> dict:
    """The parameter schema `prefect deploy` stores with a deployment (what the run form and the server use)."""
    from prefect.utilities.callables import parameter_schema
    return parameter_schema(flow).model_dump_for_openapi()


def _value_schema(prop: dict) -> dict:
    """A parameter's schema without its `null` alternative (unset: RunConfig's default)."""
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def test_every_parameter_is_described_and_bounded(flows):
    for entrypoint, flow in flows.items():
        properties = _parameter_schema(flow)["properties"]
        for name, prop in properties.items():
            assert prop.get("description"), f"{entrypoint}: parameter {name} has no description"
            value = _value_schema(prop)
            if value.get("type") in ("integer", "number"):
                assert "minimum" in value or "exclusiveMinimum" in value, f"{name} has no lower bound"
        for name in ("chains", "sessions", "sync_every", "seed"):
            assert {"minimum", "maximum"} <= set(_value_schema(properties[name])), name


def test_flow_parameters_are_run_config_fields(flows):
    """RunConfig is the one definition: each flow parameter shows its field's type, choices, bounds and
    description."""
    from seis.config import RunConfig
    fields = RunConfig.model_json_schema()["properties"]
    for flow in flows.values():
        properties = _parameter_schema(flow)["properties"]
        for name, field in RunConfig.model_fields.items():
            ours, theirs = _value_schema(properties[name]), _value_schema(fields[name])
            for key in ("type", "enum", "minimum", "maximum", "exclusiveMinimum", "minLength", "pattern"):
                assert ours.get(key) == theirs.get(key), (name, key)
            assert properties[name]["description"].startswith(field.description), name


def test_the_server_refuses_values_out_of_bounds(flows):
    """`prefect deployment run --param ...` is checked against the stored schema when the run is created."""
    from prefect.utilities.schema_tools import ValidationError, validate
    for name, d in _deployments().items():
        assert d.get("enforce_parameter_schema") is True, name
        schema = _parameter_schema(flows[d["entrypoint"]])
        validate({**d["parameters"], "sessions": 1}, schema, raise_on_error=True)
        for bad in ({"chains": 0}, {"chains": 17}, {"sessions": 0}, {"sessions": 101}, {"sync_every": 0},
                    {"seed": -1}, {"max_turns": 0}, {"max_cost_usd": 0}, {"session_deployment": "cuda"}):
            with pytest.raises(ValidationError):
                validate({**d["parameters"], **bad}, schema, raise_on_error=True)

