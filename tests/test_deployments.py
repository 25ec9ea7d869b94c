"""prefect.yaml: every deployment loads, fits its machine, runs one at a time, is scheduled apart from the others
(paused until a user resumes it) and carries parameters that the flow itself accepts; the flow's parameter schema
describes and bounds every parameter as RunConfig does. docker/: the CUDA image pins the measured versions, the
entrypoint starts whole-run and per-GPU session workers, compose runs them. No server or docker needed."""
from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import inspect
import itertools
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
MIN_GAP = dt.timedelta(minutes=60)  # between any two deployments' scheduled starts


def _prefect_yaml() -> dict:
    return yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text(encoding="utf-8"))


def _deployments() -> dict[str, dict]:
    return {d["name"]: d for d in _prefect_yaml()["deployments"]}


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
    from tasks.prefect_private import prefect_yaml_model
    model = prefect_yaml_model().model_validate(_prefect_yaml())
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

    from seis.run_config import RunConfig
    for name, d in _deployments().items():
        flow, params = flows[d["entrypoint"]], d["parameters"]
        accepted = set(inspect.signature(flow.fn).parameters)
        assert set(params) <= accepted, f"{name}: {sorted(set(params) - accepted)} are not parameters of the flow"
        # What the server enforces on `prefect deployment run --param ...`, then what the flow run itself does.
        validate(params, flow.parameters.model_dump(), raise_on_error=True, ignore_required=True)
        flow.validate_parameters(params)
        config = RunConfig(**params)  # the same cross-field checks as `seis evolve`
        assert config.protocol == (name if name != "cpu-smoke" else "sync-chain")
    assert RunConfig(**_deployments()["sync-chain"]["parameters"]).sync_every == 5   # Sync-5: half of 10 sessions


def _refused(flow, params: dict) -> bool:
    """Whether the server's schema check, the flow's own validation or RunConfig refuses params."""
    from prefect.utilities.schema_tools import validate

    from seis.run_config import RunConfig
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
    from tasks.prefect_private import deployment_schedule
    for name, d in _deployments().items():
        for schedule in d["schedules"]:
            assert deployment_schedule(schedule).get("active") is False, name


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
    from seis.run_config import RunConfig
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


# docker/: checked as text (no docker here); the entrypoint runs with a stand-in `prefect`.

DOCKER = REPO_ROOT / "docker"
MEASURED = {"torch": "2.11.0", "triton": "3.6.0", "flashinfer-python": "0.6.1", "apache-tvm-ffi": "0.1.15.post2"}


def _run_lines(dockerfile: Path) -> tuple[dict[str, str], list[str]]:
    """ARG defaults and RUN commands (continuations joined) of a Dockerfile."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text(encoding="utf-8"))
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    return args, re.findall(r"^RUN (.+)$", text, flags=re.M)


def _pip_installs(dockerfile: Path) -> list[tuple[str, list[str]]]:
    """(index URL or "", requirements) of every `pip install` of a Dockerfile, ARGs filled in."""
    args, runs = _run_lines(dockerfile)
    installs = []
    for run in runs:
        for command in re.split(r"&&|;", run):
            words = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], w) for w in shlex.split(command)]
            if words[:2] != ["pip", "install"] or "--upgrade" in words:   # pip upgrading itself, not a package
                continue
            index, requirements, skip = "", [], False
            for word, following in zip(words[2:], words[3:] + [""]):
                if skip:
                    skip = False
                elif word in ("--index-url", "-c", "--constraint"):
                    index, skip = (following if word == "--index-url" else index), True
                elif not word.startswith("-"):
                    requirements.append(word)
            installs.append((index, requirements))
    return installs


def test_cuda_image_pins_the_measured_versions():
    installs = _pip_installs(DOCKER / "Dockerfile.cuda")
    pinned = {}
    for index, requirements in installs:
        for requirement in requirements:
            name, sep, version = requirement.partition("==")
            assert sep and version, f"Dockerfile.cuda installs {requirement} unpinned"
            pinned[name.lower()] = (version, index)
    assert {name: version for name, (version, _) in pinned.items()} == MEASURED
    assert pinned["torch"][1] == pinned["triton"][1] == "https://download.pytorch.org/whl/cu130"
    import tomllib
    gpu_extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert f"flashinfer-python=={MEASURED['flashinfer-python']}" in gpu_extra   # the same FlashInfer on bare hosts
    assert "PIP_CONSTRAINT=" in " ".join(_run_lines(DOCKER / "Dockerfile.cuda")[1])   # setup.sh keeps torch


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server name
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server() -> Iterator[str]:
    """A stand-in Prefect API that answers only the health check."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api"
    server.shutdown()
    server.server_close()


def _entrypoint(tmp_path: Path, api: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run docker/entrypoint.sh with a `prefect` that records its calls (argv, device, worker name, cwd)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "prefect").write_text('#!/bin/sh\necho "$* | ${CUDA_VISIBLE_DEVICES-} | ${SEIS_WORKER_NAME-} | $PWD" '
                                     f'>> {calls}\n')
    (bin_dir / "prefect").chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SEIS_", "CUDA_VISIBLE"))}
    proc = subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path,
                          env={**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PREFECT_API_URL": api, **env})
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_entrypoint_starts_a_session_worker_per_gpu(tmp_path, fake_server):
    """`session-worker` does what scripts/one-host-workers.sh does for one GPU: the pool, the session deployment,
    a worker on the `sessions` queue with one slot, named, owning CUDA_VISIBLE_DEVICES."""
    proc, calls = _entrypoint(tmp_path, fake_server, "session-worker", SEIS_WORK_POOL="seis-cuda",
                              CUDA_VISIBLE_DEVICES="1", SEIS_WORKER_NAME="gpu1")
    assert proc.returncode == 0, proc.stderr
    deploy, worker = calls[-2].split(" | "), calls[-1].split(" | ")
    assert deploy[0] == "deploy --prefect-file flows/session-deployments.yaml --name cuda"
    assert deploy[3] == str(REPO_ROOT)      # deployed from the checkout: its sessions run there
    assert worker[:3] == ["worker start --pool seis-cuda --type process --work-queue sessions --limit 1 --name gpu1",
                          "1", "gpu1"]
    sessions = yaml.safe_load((REPO_ROOT / "flows/session-deployments.yaml").read_text())["deployments"]
    for d in sessions:     # the deployment the entrypoint names after the pool is on that pool's sessions queue
        assert d["work_pool"] == {"name": f"seis-{d['name']}", "work_queue_name": "sessions"}
    (tmp_path / "no-device").mkdir()
    proc, calls = _entrypoint(tmp_path / "no-device", fake_server, "session-worker", SEIS_WORK_POOL="seis-cuda")
    assert proc.returncode != 0 and "CUDA_VISIBLE_DEVICES" in proc.stderr and not calls   # refused, nothing started


def test_entrypoint_worker_serves_only_whole_runs(tmp_path, fake_server):
    proc, calls = _entrypoint(tmp_path, fake_server, "worker", SEIS_WORK_POOL="seis-cpu")
    assert proc.returncode == 0, proc.stderr
    assert calls[0].split(" | ")[0] == "worker start --pool seis-cpu --type process --work-queue default"


def test_compose_runs_one_session_worker_per_gpu():
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    sessions = {name: s for name, s in services.items() if s.get("command") == ["session-worker"]}
    assert len(sessions) >= 2
    devices = [s["environment"]["CUDA_VISIBLE_DEVICES"] for s in sessions.values()]
    names = [s["environment"]["SEIS_WORKER_NAME"] for s in sessions.values()]
    assert len(set(devices)) == len(devices) and len(set(names)) == len(names)
    for name, s in sessions.items():
        assert s["image"] == "seis:cuda" and s["environment"]["SEIS_WORK_POOL"] == "seis-cuda", name
        assert s["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"], name
        assert {"runs:/seis/runs", "store:/seis/store"} <= set(s["volumes"]), name   # the run's files, one store
        assert "SYS_ADMIN" in s["cap_add"] and s["depends_on"]["server"]["condition"] == "service_healthy", name
