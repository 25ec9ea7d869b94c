"""The `seis` command line, run as a user would run it (a real subprocess), and `seis evolve`'s options (in-process:
parsing and validation only, no run started)."""
from __future__ import annotations

import subprocess
import sys

import pytest


def seis(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seis.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_models_list_names_every_model():
    out = seis("models", "list")
    assert out.returncode == 0
    for name in ("smollm2-135m-instruct", "qwen3-0.6b-random", "tiny-qwen3", "tiny-llama"):
        assert name in out.stdout


def test_models_prepare_prints_the_directory():
    out = seis("models", "prepare", "tiny-llama")
    assert out.returncode == 0 and out.stdout.strip().endswith("tiny-llama")


def test_generate_prints_only_the_generated_text():
    from transformers import AutoModelForCausalLM
    import torch
    from seis.models import resolve_model
    from seis.prompts import load_tokenizer

    out = seis("generate", "--model", "tiny-qwen3", "--max-new-tokens", "8", "--device", "cpu", "hello")
    assert out.returncode == 0, out.stderr
    model_dir = resolve_model("tiny-qwen3")
    tok = load_tokenizer(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tok("hello")["input_ids"]
    ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(ids):]
    assert out.stdout == tok.decode(ref, skip_special_tokens=True) + "\n"


@pytest.mark.slow
def test_generate_chat_on_smollm2_answers():
    out = seis("generate", "--model", "smollm2-135m-instruct", "--chat", "--max-new-tokens", "40", "What is 2+3?")
    assert out.returncode == 0, out.stderr
    assert "5" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["generate", "--model", "no-such-model", "hi"], "no-such-model"),
    (["generate", "--model", "tiny-qwen3", "   "], "prompt is empty"),
    (["generate", "--model", "tiny-qwen3", "--top-p", "0", "hi"], "top-p"),
    (["generate", "--model", "tiny-qwen3", "--device", "gpu", "hi"], "--device must be auto, cpu or cuda, got 'gpu'"),
    (["models", "prepare", "no-such-model"], "no-such-model"),
])
def test_bad_input_exits_2_with_a_clear_message(args, message):
    out = seis(*args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def evolve_options() -> dict:
    import typer.main

    from seis.cli import app
    return {p.name: p for p in typer.main.get_command(app).commands["evolve"].params}


def test_every_run_config_field_is_an_evolve_option_described_as_in_run_config():
    from seis.run_config import RunConfig
    options = evolve_options()
    assert set(options) == set(RunConfig.model_fields) | {"resume"}
    for name, field in RunConfig.model_fields.items():
        assert options[name].opts == ["--" + name.replace("_", "-")] and field.description in options[name].help
    assert "(default 2)" in options["chains"].help and "(default sync-chain)" in options["protocol"].help
    from typer.testing import CliRunner

    from seis.cli import app
    shown = CliRunner().invoke(app, ["evolve", "--help"]).output
    assert "<smoke|quick|full>" in shown and "<local|workers>" in shown and "--resume" in shown  # Literal: choices


def test_evolve_options_reach_the_config_as_given(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import seis.cli
    seen = {}

    def preflight(values, resume):
        seen.update(values)
        raise SystemExit(0)
    monkeypatch.setattr(seis.cli, "_evolve_preflight", preflight)
    out = CliRunner().invoke(seis.cli.app, ["evolve", "--protocol", "chain", "--chains", "3", "--agent-pass-env",
                                            "A, B", "--agent-pass-env", "C", "--agent-prices", '{"m": [1, 2]}'])
    assert out.exit_code == 0, out.output
    assert seen["protocol"] == "chain" and seen["chains"] == 3 and seen["agent_pass_env"] == ["A", "B", "C"]
    assert seen["agent_prices"] == {"m": [1, 2]} and seen["sessions"] is None and seen["out"] is None


@pytest.mark.parametrize("resumed", [False, True])
def test_ctrl_c_during_the_checks_before_a_run_says_what_to_do(monkeypatch, tmp_path, resumed):
    """The checks before a run (the model, the store, the output dir) take seconds: Ctrl-C there exits 130 with one
    line, as later, not silently: start again, or, for a resume, resume again."""
    import signal

    from typer.testing import CliRunner

    import seis.cli
    run = tmp_path / "run"
    run.mkdir()
    if resumed:
        (run / "config.json").write_text("{}")

    def preflight(values, resume):
        raise KeyboardInterrupt
    monkeypatch.setattr(seis.cli, "_evolve_preflight", preflight)
    before = signal.getsignal(signal.SIGINT)
    out = CliRunner().invoke(seis.cli.app, ["evolve", *(["--resume", str(run)] if resumed else ["--out", str(run)])])
    assert out.exit_code == 130, out.output
    said = f"continue with: seis evolve --resume {run}" if resumed else "interrupted before the run started"
    assert said in out.output and len(out.output.strip().splitlines()) == 1, out.output
    assert signal.getsignal(signal.SIGINT) is before   # the command's own handlers are gone again


def test_ctrl_c_that_something_swallowed_still_stops_the_run(monkeypatch, tmp_path):
    """The handler's KeyboardInterrupt can land in code that swallows it (an `except BaseException` in a library, a
    finalizer). The run must still not start: exit 130 with the one line, not a run whose engines are refused."""
    import signal
    import threading
    import types

    from typer.testing import CliRunner

    import seis.cli
    from seis.sandbox import process
    monkeypatch.setattr(process, "_INTERRUPTED", threading.Event())  # this test's interrupt, not the process's
    started = []

    def preflight(values, resume):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # swallowed where it landed
        return types.SimpleNamespace(out=tmp_path / "run")  # what the command reads of the config

    monkeypatch.setattr(seis.cli, "_evolve_preflight", preflight)
    monkeypatch.setattr(seis.cli, "_prefect_api", lambda out: started.append(out))
    out = CliRunner().invoke(seis.cli.app, ["evolve", "--out", str(tmp_path / "run")])
    assert out.exit_code == 130, out.output
    assert "interrupted before the run started" in out.output and len(out.output.strip().splitlines()) == 1
    assert started == [] and process.interrupted()  # nothing after the checks ran; every sandbox is refused


@pytest.mark.parametrize("args, message", [
    (["--chains", "0"], "--chains: Input should be greater than or equal to 1"),
    (["--max-cost-usd", "-1"], "--max-cost-usd: Input should be greater than 0"),
    (["--max-cost-usd", "inf"], "--max-cost-usd: Input should be a finite number"),  # no limit is leaving it out
    (["--session-deployment", "no-slash"], "--session-deployment: String should match pattern"),
    (["--agent-prices", "[1, 2]"], "--agent-prices: Input should be a valid dictionary"),  # JSON, not a list option
])
def test_evolve_value_out_of_bounds_exits_2_with_one_line(tmp_path, args, message):
    from typer.testing import CliRunner

    from seis.cli import app
    out = CliRunner().invoke(app, ["evolve", "--out", str(tmp_path / "run"), *args])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("store, message", [
    ("file", "store {} exists and is not a directory"),
    ("file/sub", "store {}/sub cannot be created: {} is not a directory (not writable)")])
def test_evolve_with_a_store_that_is_a_file_exits_2_before_any_work(tmp_path, store, message):
    """--store naming a file (or a path under one) is refused like --out is, before the run directory is made; it
    was found only inside the flow, as a FileExistsError traceback, with a run directory left behind."""
    from typer.testing import CliRunner

    from seis.cli import app
    (tmp_path / "file").write_text("not a store\n")
    out = CliRunner().invoke(app, ["evolve", "--out", str(tmp_path / "run"), "--store", str(tmp_path / store),
                                   "--model", "tiny-qwen3", "--device", "cpu", "--gate", "smoke"])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    lines = out.stderr.splitlines()
    assert lines == ["error: " + message.format(tmp_path / "file", tmp_path / "file")], out.stderr
    assert not (tmp_path / "run").exists() and (tmp_path / "file").read_text() == "not a store\n"


def test_evolve_with_an_agent_library_that_holds_no_transformation_exits_2(tmp_path):
    """An --agent-library dir with no transformation in it (a wrong path) is refused: it ran every session to
    no_change and exited 0."""
    from typer.testing import CliRunner

    from seis.cli import app
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "notes.txt").write_text("not a transformation\n")
    out = CliRunner().invoke(app, ["evolve", "--out", str(tmp_path / "run"), "--store", str(tmp_path / "store"),
                                   "--agent-library", str(tmp_path / "lib"), "--model", "tiny-qwen3", "--device", "cpu",
                                   "--gate", "smoke"])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: agent library {tmp_path / 'lib'} holds no "
                                                   "transformations"), out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("recorded", [b'{"protocol": "chain", "cha', b'\x00\xff\xfe', b'[1, 2]'])
def test_evolve_resume_of_a_damaged_config_json_exits_2_naming_it(tmp_path, recorded):
    """--resume of a run whose config.json is truncated, not UTF-8 or not a mapping: one line that names the file
    (bytes that were no UTF-8 gave only the codec's words), and the file is left as it was."""
    from typer.testing import CliRunner

    from seis.cli import app
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_bytes(recorded)
    out = CliRunner().invoke(app, ["evolve", "--resume", str(run)])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {run}/config.json is not a valid run config: "), out.stderr
    assert (run / "config.json").read_bytes() == recorded and sorted(p.name for p in run.iterdir()) == ["config.json"]


@pytest.mark.parametrize("command, target", [("post-validate", "file"), ("post-validate", "file/sub"),
                                             ("gate", "dir")])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_work(tmp_path, monkeypatch, command, target):
    """post-validate --out naming a file (or a path under one), gate --json naming a directory: exit 2 before any
    engine runs; both were found only when the results were written, at the end, with a traceback, and the
    results were lost."""
    from typer.testing import CliRunner

    import seis.evaluator
    import seis.postval
    from seis.cli import app
    from seis.engine_import import ENGINE_TEMPLATE

    def work(config):
        raise AssertionError("the work started")
    monkeypatch.setattr(seis.postval, "run_post_validation", work)
    monkeypatch.setattr(seis.evaluator, "run_gate", work)
    (tmp_path / "file").write_text("kept\n")
    (tmp_path / "dir").mkdir()
    path = tmp_path / target
    args = (["post-validate", "--engine", str(ENGINE_TEMPLATE), "--out", str(path)] if command == "post-validate"
            else ["gate", "--candidate", str(ENGINE_TEMPLATE), "--json", str(path)])
    out = CliRunner().invoke(app, [*args, "--model", "tiny-qwen3", "--device", "cpu", "--quick"])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {args[-2]} {path} "), out.stderr
    assert (tmp_path / "file").read_text() == "kept\n" and not any((tmp_path / "dir").iterdir())


def _evolve_with_flow(monkeypatch, config, flow_fn):
    """`seis evolve` run in process on `config`, with `flow_fn` in place of the flow and no Prefect server."""
    import sys
    from types import ModuleType

    from typer.testing import CliRunner

    import flows.runtime
    import seis.cli

    flow = ModuleType("flows.seis_flow")
    flow.seis = flow_fn
    monkeypatch.setitem(sys.modules, "flows.seis_flow", flow)
    monkeypatch.setattr(seis.cli, "_evolve_preflight", lambda values, resume: config)
    monkeypatch.setattr(seis.cli, "_prefect_api", lambda out: None)
    monkeypatch.setattr(seis.cli, "_stacks_on_sigusr1", lambda: None)  # needs a real stderr
    monkeypatch.setattr(flows.runtime, "apply", lambda: None)
    return CliRunner().invoke(seis.cli.app, ["evolve"])


@pytest.mark.parametrize("recorded", ["complete", "cancelled"])
def test_evolve_whose_cancellation_came_after_the_run_completed_follows_status_json(tmp_path, monkeypatch, recorded):
    """A cancellation seen just after the run completed ends the flow Cancelled, yet status.json keeps `complete`:
    `seis evolve` says so in one line and exits 0 (before: exit 1 and "continue with: seis evolve --resume", a
    resume of a complete run). A run the cancellation did stop still exits 1 with the resume hint."""
    from types import SimpleNamespace

    import seis.cli
    from seis.run_config import RunConfig
    from seis.session import RunDir

    config = RunConfig(out=tmp_path / "run", store=tmp_path / "store", model="tiny-qwen3", device="cpu")
    run = RunDir.create(config.out, config.model_dump_json(indent=2))
    run.set_status("running", restart=True, flow_run_id="fr-1", sessions_total=1)
    run.set_status(recorded, flow_run_id="fr-1", sessions_done=1)
    # the flow as it ended: Cancelled, status.json as above
    out = _evolve_with_flow(monkeypatch, config, lambda **kw: SimpleNamespace(
        is_completed=lambda: False, is_cancelled=lambda: True, name="Cancelled",
        message=f"the run in {config.out} was cancelled"))
    if recorded == "complete":
        assert out.exit_code == 0, out.output
        assert "--resume" not in out.output and "complete" in out.stdout and str(config.out) in out.stdout
        assert len(out.stdout.splitlines()) == 1, out.stdout
        assert "--resume" not in seis.cli._after_failure(config.out)  # nor any other ending of a complete run
    else:
        assert out.exit_code == 1 and f"continue with: seis evolve --resume {config.out}" in out.stderr, out.output


@pytest.mark.parametrize("recorded", [False, True])
def test_evolve_whose_prefect_api_fails_says_why_in_one_line(tmp_path, monkeypatch, recorded):
    """The run's own Prefect server on a full disk answers 500 to the flow's first call: `seis evolve` printed
    Prefect's client traceback. Now one line names the full disk (from the server's log) and what to do: start
    again where nothing was recorded, resume where the run's config is."""
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError

    from seis.run_config import RunConfig

    config = RunConfig(out=tmp_path / "run", store=tmp_path / "store", model="tiny-qwen3", device="cpu")
    (config.out / ".prefect").mkdir(parents=True)
    (config.out / ".prefect" / "server.log").write_text("sqlite3.OperationalError: database or disk is full\n")
    if recorded:
        (config.out / "config.json").write_text(config.model_dump_json())

    def seis_flow(**kw):
        request = httpx.Request("POST", "http://127.0.0.1:1/api/flows/")
        error = httpx.HTTPStatusError("Server error '500 Internal Server Error' for url 'http://127.0.0.1:1/api/"
                                      "flows/'", request=request, response=httpx.Response(500, request=request))
        raise PrefectHTTPStatusError.from_httpx_error(error)

    out = _evolve_with_flow(monkeypatch, config, seis_flow)
    assert out.exit_code == 1, out.output
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the run's Prefect API failed (Server error '500"), lines
    assert f"the disk holding {config.out} is full" in lines[0]
    assert (f"continue with: seis evolve --resume {config.out}" in lines[0]) == recorded, lines[0]


def test_a_run_refused_before_any_work_suggests_no_resume(tmp_path):
    """Refused at its start (another run took the output dir meanwhile), a run has nothing to resume: the hint
    pointed at the other run's directory."""
    import seis.cli
    from seis.session import RunDir
    from seis.session.status import REFUSED
    RunDir.create(tmp_path / "run", "{}")  # the other run's
    message = f"{REFUSED}: output dir {tmp_path / 'run'} holds a run (another run started in it at the same time)"
    assert seis.cli._after_failure(tmp_path / "run", message) == ""
    assert "--resume" in seis.cli._after_failure(tmp_path / "run", "c0/s0: the gate failed")


def test_post_validate_refuses_an_out_dir_that_holds_an_earlier_result(tmp_path, monkeypatch):
    """An earlier postval.json is kept: the run is refused before any engine starts, not overwritten at its end."""
    from typer.testing import CliRunner

    import seis.postval
    from seis.cli import app
    from seis.engine_import import ENGINE_TEMPLATE

    def work(config):
        raise AssertionError("the work started")
    monkeypatch.setattr(seis.postval, "run_post_validation", work)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "postval.json").write_text('{"kept": true}\n')
    out = CliRunner().invoke(app, ["post-validate", "--engine", str(ENGINE_TEMPLATE), "--out", str(earlier),
                                   "--model", "tiny-qwen3", "--device", "cpu", "--quick"])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit), out.output
    assert out.stderr.splitlines() == [f"error: --out {earlier} already holds a post-validation result "
                                       f"(postval.json); choose another --out"]
    assert sorted(p.name for p in earlier.iterdir()) == ["postval.json"]
    assert (earlier / "postval.json").read_text() == '{"kept": true}\n'



def test_a_base_engine_that_is_a_file_is_called_one(tmp_path):
    """Not "does not exist": the path is there, and the operator should look at what it is."""
    f = tmp_path / "engine.tar"
    f.write_text("not a directory\n")
    out = seis("evolve", "--base-engine", str(f), "--out", str(tmp_path / "run"), "--device", "cpu")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{f} is not a directory" in out.stderr, out.stderr
    missing = seis("evolve", "--base-engine", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run2"),
                   "--device", "cpu")
    assert missing.returncode == 2 and "does not exist" in missing.stderr, missing.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "run2").exists()  # refused before any work
