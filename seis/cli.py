"""`seis` command line. Each command validates its input, then calls the library."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="SEIS: self-evolving inference systems.")
models_app = typer.Typer(no_args_is_help=True, help="Model assets (prepared locally; no hub needed).")
app.add_typer(models_app, name="models")


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@models_app.command("list")
def models_list() -> None:
    """List the named models and whether each is prepared."""
    from .models import list_models
    for entry in list_models():
        state = "prepared" if entry.prepared else "not prepared"
        typer.echo(f"{entry.spec.name:24s} {state:13s} {entry.spec.description}")


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
    typer.echo(tokenizer.decode(out["token_ids"], skip_special_tokens=True))


if __name__ == "__main__":
    app()
