"""`seis` command line. Each command validates its input, then calls the library."""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from types import UnionType
from typing import Literal, Optional, Union, get_args, get_origin

import typer
from pydantic_core import PydanticUndefined

from .tables import printable

app = typer.Typer(no_args_is_help=True, add_completion=False, help="SEIS: self-evolving inference systems.")
models_app = typer.Typer(no_args_is_help=True, help="Model assets (prepared locally; no hub needed).")
app.add_typer(models_app, name="models")


def _fail(message: str, code: int = 2) -> None:
    """Print the error and exit. A message can quote a candidate engine (its error, its stderr's tail) or an agent:
    shown through printable, so no escape sequence or bidi control in it reaches the terminal."""
    typer.secho(f"error: {printable(message)}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _check_writable(path: Path, flag: str, is_dir: bool) -> None:
    """What a command writes only at its end is checked before its work: a result is never lost to a bad path."""
    from .writable import unwritable
    if (problem := unwritable(path, flag, is_dir)) is not None:
        _fail(problem)


@models_app.command("list")
def models_list() -> None:
    """List the named models and whether each is prepared."""
    from .models import list_models
    from .tables import plain
    rows = [(m.entry.name, "prepared" if m.prepared else "not prepared", m.entry.description) for m in list_models()]
    typer.echo(plain(("model", "state", "what it is"), rows))


@models_app.command("prepare")
def models_prepare(name: str, force: bool = typer.Option(False, help="Rebuild even if already prepared.")) -> None:
    """Materialize a named model as a Hugging Face directory in the cache; prints its path."""
    from .models import ModelError, prepare_model
    try:
        typer.echo(str(prepare_model(name, force=force)))
    except ModelError as e:
        _fail(str(e))


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="Prompt text (raw, or a user message with --chat)."),
    model: str = typer.Option("smollm2-135m-instruct", help="Model name (seis models list) or a local HF dir."),
    max_new_tokens: int = typer.Option(128, min=1),
    chat: bool = typer.Option(False, help="Apply the model's chat template to the prompt."),
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0),
    seed: Optional[int] = typer.Option(None),
    engine_dir: Optional[Path] = typer.Option(None, help="Engine to run (default: the vanilla E0)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
) -> None:
    """Generate a continuation with an engine; prints only the generated text."""
    from .engine_host import EngineError, EngineProcess
    from .engine_host.client import Sampling
    from .engine_import import ENGINE_TEMPLATE
    from .models import ModelError, resolve_model
    from .prompts import encode_prompt, load_tokenizer

    if not prompt.strip():
        _fail("the prompt is empty")
    if device not in ("auto", "cpu", "cuda"):  # else torch's list of two dozen device types, from the engine
        _fail(f"--device must be auto, cpu or cuda, got {device!r}")
    if not 0.0 < top_p <= 1.0:
        _fail(f"--top-p must be in (0, 1], got {top_p}")
    try:
        model_dir = resolve_model(model)
        tokenizer = load_tokenizer(model_dir)
        ids = encode_prompt(tokenizer, prompt, chat=chat)
        with EngineProcess(engine_dir or ENGINE_TEMPLATE, model_dir, {"device": device}) as engine:
            engine.build()
            out = engine.generate([ids], Sampling(max_new_tokens=max_new_tokens, temperature=temperature,
                                                  top_p=top_p, seed=seed))[0]
    except (ModelError, EngineError, ValueError) as e:
        _fail(str(e))
    typer.echo(printable(tokenizer.decode(out["token_ids"], skip_special_tokens=True)))  # an engine's output


@app.command()
def gate(
    candidate: Path = typer.Option(..., help="Engine directory to judge (holds the package engine/)."),
    model: str = typer.Option(..., help="Model name (seis models list) or a local HF dir."),
    reference: Optional[Path] = typer.Option(None, help="Reference engine (default: the vanilla E0)."),
    parent: Optional[Path] = typer.Option(None, help="Parent engine, measured for the speed ratio."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the full GateResult JSON here."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    quick: bool = typer.Option(False, help="Few prompts, short outputs: a fast look, not a verdict to keep."),
    prepared_dir: Optional[Path] = typer.Option(None, help="Prepared workloads (default: data/prepared)."),
) -> None:
    """Judge a candidate engine against the reference: correctness checks (dev and held-out), dev speed, verdict.
    Exit 0 pass, 1 fail, 2 bad input."""
    from .evaluator import GateConfig, GateInputError, HostFailure, ReferenceFailure, render_gate, run_gate

    if device not in ("auto", "cpu", "cuda"):
        _fail(f"--device must be auto, cpu or cuda, got {device!r}")
    if json_out is not None:  # written only at the end, as it is (its directory is not made)
        if not json_out.parent.is_dir():
            _fail(f"--json: directory {json_out.parent} does not exist")
        _check_writable(json_out, "--json", is_dir=False)
    values = {"candidate": candidate, "model": model, "parent": parent, "device": device,
              "prepared_dir": prepared_dir}
    if reference is not None:
        values["reference"] = reference
    config = GateConfig.preset("quick" if quick else "full", **values)
    try:
        result = run_gate(config)
    except GateInputError as e:
        _fail(str(e))
    except ReferenceFailure as e:
        _fail(f"the reference engine failed, so no verdict was reached: {e}")
    except HostFailure as e:
        _fail(f"{e} (free memory and run the gate again)")
    if json_out is not None:
        json_out.write_text(result.model_dump_json(indent=2) + "\n")
    typer.echo(printable(render_gate(result)))
    raise typer.Exit(0 if result.verdict == "pass" else 1)


@app.command("post-validate")
def post_validate(
    engine: Optional[Path] = typer.Option(None, "--engine", help="Engine dir to judge (holds package `engine`)."),
    snapshot: Optional[str] = typer.Option(None, "--snapshot", help="Snapshot id instead of --engine (the store)."),
    store_root: Path = typer.Option(Path("store"), "--store-root", help="Snapshot store root (with --snapshot)."),
    model: str = typer.Option(..., "--model", help="Model name (seis models list) or a local HF dir."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output dir (default runs/postval/<time>)."),
    gsm8k_items: Optional[int] = typer.Option(None, "--gsm8k-items", help="GSM8K held-out items (max 660; 0 skips)."),
    retrieval_items: Optional[int] = typer.Option(None, "--retrieval-items", help="Retrieval items (max 270)."),
    speed_requests: Optional[int] = typer.Option(None, "--speed-requests", help="GSM8K requests timed (default 100)."),
    fixed_single_requests: Optional[int] = typer.Option(
        None, "--fixed-single-requests", help="Of those, timed one at a time at fixed length (default 8)."),
    dev_requests: Optional[int] = typer.Option(None, "--dev-requests", help="Dev prompts per dev workload (default 8)."),
    heldout: bool = typer.Option(True, "--heldout/--no-heldout", help="Time the held-out shapes too."),
    reps: Optional[int] = typer.Option(None, "--reps", help="Timed repetitions per engine (default 3)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", help="Engine option (default 32)."),
    max_seq_len: Optional[int] = typer.Option(None, "--max-seq-len", help="Engine context (default: the model's)."),
    cpu_threads: Optional[int] = typer.Option(None, "--cpu-threads", help="Threads per engine process on a CPU."),
    speculation: bool = typer.Option(True, "--speculation/--no-speculation",
                                     help="Engines that draft and verify tokens may (default) or may not."),
    bandwidth_gbs: Optional[float] = typer.Option(None, "--bandwidth-gbs", help="Device GB/s (default: measured)."),
    dev_speedup: Optional[float] = typer.Option(None, "--dev-speedup", help="The gate's dev speedup, shown alongside."),
    prepared_dir: Optional[Path] = typer.Option(None, "--prepared-dir", help="Workloads (default data/prepared)."),
    quick: bool = typer.Option(False, "--quick", help="Small smoke run (few items, short outputs, small KV cache)."),
) -> None:
    """Judge a retained engine against vanilla E0: accuracy, speed, latency, bound; tables and figures."""
    import datetime as dt

    from .engine_host import EngineError
    from .evaluator import HostFailure
    from .postval import PostValError, check_model, fetch_snapshot, make_config, run_post_validation
    from .postval.tables import accuracy_markdown, speed_markdown

    if (engine is None) == (snapshot is None):
        _fail("pass exactly one of --engine DIR or --snapshot ID")
    out = out or Path("runs/postval") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    _check_writable(out, "--out", is_dir=True)
    if (out / "postval.json").exists():  # an earlier result is never overwritten at the end of a long run
        _fail(f"--out {out} already holds a post-validation result (postval.json); choose another --out")
    values = {"engine_dir": engine or out / "engine", "model": model, "out_dir": out, "device": device,
              "gsm8k_items": gsm8k_items, "retrieval_items": retrieval_items, "speed_requests": speed_requests,
              "fixed_single_requests": fixed_single_requests, "dev_requests": dev_requests, "heldout": heldout, "reps": reps,
              "max_batch_size": max_batch_size, "max_seq_len": max_seq_len, "cpu_threads": cpu_threads,
              "speculation": speculation, "bandwidth_gbs": bandwidth_gbs, "reported_dev_speedup": dev_speedup, "prepared_dir": prepared_dir,
              "quick": quick}
    try:
        config = make_config(**{k: v for k, v in values.items() if v is not None})
        if snapshot is not None:
            check_model(model)  # bad input fails before the snapshot is copied out
            fetch_snapshot(snapshot, store_root, config.engine_dir)
        import logging
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")  # progress
        result = run_post_validation(config)
    except PostValError as e:
        _fail(str(e))
    except EngineError as e:  # an engine that crashes or misbehaves: say so, exit 1, no traceback
        _fail(f"engine failed during post-validation: {e}", code=1)
    except HostFailure as e:  # not the candidate's doing: no result either way
        _fail(f"post-validation stopped by a host failure, no result: {e}", code=1)
    typer.echo(printable(accuracy_markdown(result)))
    typer.echo(printable(speed_markdown(result)))
    for note in result.notes:
        typer.echo(f"note: {printable(note)}")
    typer.echo(f"wrote {len(result.files)} files to {out} in {result.wall_s:.0f} s")
    if result.flags:
        typer.secho("flagged: " + printable("; ".join(result.flags)), fg=typer.colors.YELLOW, err=True)


def _run_config_options(command):
    """Gives `command` an option per RunConfig field (`--sync-every` for sync_every), which it takes as **fields:
    the field's description as help, its default shown, None when not given (the resolved config then has the
    field's default). Literal fields are choices, bools --flag/--no-flag, lists repeatable or comma-separated,
    other structures JSON; bounds are RunConfig's to check (its one-line message names the option)."""
    from .run_config import RunConfig

    def option(name: str, field) -> inspect.Parameter:
        kind = field.annotation
        if get_origin(kind) in (Union, UnionType):  # `int | None`: the option is optional anyway
            kind = next(a for a in get_args(kind) if a is not type(None))
        decls, extra = ["--" + name.replace("_", "-")], {}
        help = field.description or name
        if kind is bool:
            decls = [f"{decls[0]}/--no-{decls[0][2:]}"]
        elif get_origin(kind) is list:
            kind, help = list[str], help + "; repeat the option or separate with commas"
        elif kind not in (int, float, str, Path) and get_origin(kind) is not Literal:
            kind, extra = object, {"parser": json.loads, "metavar": "JSON"}
        if field.default not in (None, PydanticUndefined):
            help += f" (default {field.default})"
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[kind],
                                 default=typer.Option(None, *decls, help=help, show_default=False, **extra))

    own = [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.kind is not p.VAR_KEYWORD]
    command.__signature__ = inspect.Signature([option(n, f) for n, f in RunConfig.model_fields.items()] + own)
    command.__annotations__ = {p.name: p.annotation for p in command.__signature__.parameters.values()}
    return command


@app.command()
@_run_config_options
def evolve(
    resume: Optional[Path] = typer.Option(None, "--resume", metavar="RUN_DIR",
                                          help="Continue an interrupted run from its recorded config: finished "
                                               "sessions are kept, the rest are redone."),
    **fields,
) -> None:
    """Run an evolution (the `seis` Prefect flow; no server needed) and print the summary table. Each option but
    --resume is a RunConfig field."""
    from .run_config import RunConfig
    lists = {name for name, field in RunConfig.model_fields.items() if get_origin(field.annotation) is list}
    values = {name: [v.strip() for item in value for v in item.split(",") if v.strip()]  # a JSON option stays as given
              if name in lists and value is not None else value for name, value in fields.items()}
    config, (previous, caught) = None, _stop_engines_on_interrupt()  # the checks and the server's start take seconds
    try:
        config = _evolve_preflight(values, resume)
        _raise_if_caught(caught)
        _prefect_api(config.out)
        from flows.runtime import apply
        apply()  # Prefect's settings, before Prefect is imported
        from flows.seis_flow import seis as seis_flow
        _stacks_on_sigusr1()
        _raise_if_caught(caught)
        state = seis_flow(**({"resume": str(resume)} if resume is not None else {"config": config}),
                          return_state=True)
        if not state.is_completed():
            _raise_if_caught(caught)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the engines are dead already, the flow has crashed
        _fail(_interrupted(config.out if config is not None else resume), code=130)
    except Exception as e:  # the Prefect API failed under the flow (its server's disk full, the server gone)
        import httpx
        if not isinstance(e, httpx.HTTPError):
            raise
        _fail(_api_failure(e, config.out), code=1)
    finally:
        _restore_signals(previous)
    if state.is_cancelled() and _completed(config.out):  # cancelled only after it completed: its results stand
        typer.echo(f"the cancellation came after the run had completed (status.json: complete); run directory: "
                   f"{printable(str(config.out))}")
        return
    if not state.is_completed():  # one line, not the tracebacks (those are in the task runs' logs)
        _fail(f"{state.message or f'the run ended {state.name}'}{_after_failure(config.out, state.message)}", code=1)
    recorded = _status(config.out)
    if recorded is not None and recorded.message:  # e.g. what post-validation flagged about the best engine
        typer.secho(f"note: {printable(recorded.message)}", fg=typer.colors.YELLOW, err=True)
    typer.echo(f"run directory: {printable(state.result())}")


def _api_failure(error: Exception, out: Path) -> str:
    """One line for a Prefect API that failed under the flow: its cause where the run's own server logged it (a
    full disk: SQLite's "database or disk is full"), what to do next, never the client's traceback."""
    from flows.local_server import run_home
    log = run_home(out) / "server.log"
    try:
        full = "database or disk is full" in log.read_text(errors="replace")[-200_000:]
    except OSError:
        full = False
    cause = (f"the disk holding {out} is full (its Prefect server's database cannot grow); free space, then"
             if full else f"see {log};" if log.is_file() else "check the server at PREFECT_API_URL, then")
    first = str(error).splitlines()[0].split(" - ")[0] if str(error) else type(error).__name__  # not httpx's links
    then = (f" continue with: seis evolve --resume {out}" if (out / "config.json").is_file()
            else " start the run again (nothing of it was recorded)")
    return f"the run's Prefect API failed ({first}): {cause}{then}"


def _status(out: Path):
    from .session.status import read_status
    return read_status(out)


def _completed(out: Path) -> bool:
    from .session.status import read_status
    recorded = read_status(out)
    return recorded is not None and recorded.state == "complete"


def _after_failure(out: Path, message: str | None = None) -> str:
    """What to do about a run that did not complete: resume it, unless every session is recorded or another flow
    holds it (a resume is refused while that one works); never for a run status.json says is complete, nor for one
    refused before any work (what its directory holds is another run's, or nothing)."""
    from .session.rundir import RunDir
    from .session.status import FINISHED_FAILED_NOTE, REFUSED, read_status
    if (message or "").startswith(REFUSED):
        return ""
    recorded = read_status(out)
    if recorded is not None and recorded.state == "complete":
        return " (status.json says the run is complete: nothing to resume)"
    if recorded is not None and recorded.note == FINISHED_FAILED_NOTE:
        return " (every session is recorded: a new run is needed, not a resume)"
    if (out / "config.json").is_file():
        try:
            with RunDir.open(out).lock():
                pass
        except TimeoutError:
            return ""  # the flow's own message says to wait for the other one or cancel it
    return f" (continue with: seis evolve --resume {out})"


@app.command()
def timeline(run_dir: Path = typer.Argument(..., help="A run directory (finished or not).")) -> None:
    """When and where each gate of a run ran (worker, device, seconds from the first), and what overlapped."""
    from .session.timeline import read_gates, timeline_markdown
    if not (run_dir / "config.json").is_file():
        _fail(f"{run_dir} is not a SEIS run directory (no config.json)")
    typer.echo(printable(timeline_markdown(*read_gates(run_dir))))


def _evolve_preflight(values: dict, resume: Optional[Path]):
    """The run's config, validated, with the machine checked (output dir, model, memory): exit 2 otherwise."""
    from .session.params import ParameterError, resolve_config
    from .session.preflight import preflight_run

    try:
        resolved = resolve_config(None, values, resume, flag=lambda name: "--" + name.replace("_", "-"))
        for name, value in resolved.ignored.items():
            typer.secho(f"note: --{name.replace('_', '-')} {value} ignored: --resume uses the run's recorded config",
                        fg=typer.colors.YELLOW, err=True)
        if resolved.config.dispatch == "workers" and not os.environ.get("PREFECT_API_URL"):
            raise ValueError("--dispatch workers needs a Prefect server with workers on its pool: set "
                             "PREFECT_API_URL (README, 'Scale-out: sessions on GPU workers')")
        preflight_run(resolved.config, resume=resolved.resume)
    except (ParameterError, ValueError) as e:
        _fail(str(e))
    return resolved.config


def _prefect_api(run_dir: Path) -> None:
    """The Prefect API the run talks to: PREFECT_API_URL's, else a server of the run's own (flows/local_server.py)
    whose state (database, GPU concurrency limit) lives in the run directory; a shared ~/.prefect would let a
    killed run's slot lease block every later run. Called before Prefect is imported."""
    if os.environ.get("PREFECT_API_URL"):
        return
    import atexit

    from flows.local_server import ServerError, run_home, start_local_server
    home = run_home(run_dir)  # never the operator's PREFECT_HOME: that may be a shared server's, with its database
    try:
        server = start_local_server(home)
    except ServerError as e:
        _fail(str(e), code=1)
    atexit.register(server.stop)  # registered before Prefect's own handlers, so it runs after them
    os.environ["PREFECT_API_URL"], os.environ["PREFECT_HOME"] = server.url, str(home)
    from tasks.gpu import OWN_SERVER_ENV
    os.environ[OWN_SERVER_ENV] = server.url  # the GPU slot's leases belong to this run's database, not to a port


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's stack to stderr: for a run that seems stuck (where it waits)."""
    import faulthandler
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _interrupted(run_dir: Path | None) -> str:
    """What to do after Ctrl-C: continue the run, or, stopped before the flow recorded it, start it again."""
    if run_dir is not None and (run_dir / "config.json").is_file():
        return f"interrupted; continue with: seis evolve --resume {run_dir}"
    return "interrupted before the run started (nothing of it ran); start it again with the same command"


def _stop_engines_on_interrupt() -> tuple[dict, list[int]]:
    """Ctrl-C (SIGINT) or SIGTERM: kill every engine sandbox at once and start no new one, so that the gates in
    flight end now (with no verdict) instead of running to their end; then the flow crashes as Prefect makes it.
    A signal the caller set to be ignored (a background job's SIGINT) stays ignored. Returns the handlers it
    replaced and the list the signals caught are added to."""
    import signal
    # Not seis.sandbox.interrupted(): a cancellation sets that too, and a cancelled run ends as cancelled, not 130
    caught: list[int] = []

    def on_signal(signum, frame):
        from .sandbox import interrupt
        caught.append(signum)
        interrupt()
        raise KeyboardInterrupt

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, on_signal)
    return previous, caught


def _raise_if_caught(caught: list[int]) -> None:
    """The KeyboardInterrupt of a signal caught, again: code that the signal interrupted may have swallowed it (an
    `except BaseException` in a library, a finalizer), and the run must still end as interrupted."""
    if caught:
        raise KeyboardInterrupt


def _restore_signals(previous: dict) -> None:
    import signal
    for sig, handler in previous.items():
        signal.signal(sig, handler)


if __name__ == "__main__":
    app()
