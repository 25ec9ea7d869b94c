"""Turn a model name or a local directory into a validated HF model directory."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .cache import is_prepared, materialize, model_path
from .errors import ModelError
from .registry import REGISTRY, ModelEntry, get_entry


@dataclass(frozen=True)
class ModelStatus:
    entry: ModelEntry
    path: Path
    prepared: bool


def list_models() -> list[ModelStatus]:
    return [ModelStatus(entry, model_path(entry.name), is_prepared(entry)) for entry in REGISTRY.values()]


def prepare_model(name: str, force: bool = False) -> Path:
    """Materialize a registry model into the cache (a no-op if already there, unless `force`)."""
    return materialize(get_entry(name), force=force)


def resolve_model(name_or_path: str | os.PathLike[str], prepare: bool = True) -> Path:
    """A registry name -> its cached directory (prepared on demand unless `prepare=False`);
    an existing directory -> itself, once validated as an HF model directory.

    Registry names win over same-named relative paths; write `./name` to mean the directory.
    """
    key = os.fspath(name_or_path)
    if key in REGISTRY:
        entry = REGISTRY[key]
        if prepare:
            return materialize(entry)
        if not is_prepared(entry):
            raise ModelError(f"model {key!r} is not prepared in {model_path(key)}; "
                             f"call prepare_model({key!r}) or resolve_model({key!r}, prepare=True)")
        return model_path(key)
    path = Path(key).expanduser()
    if path.is_dir():
        return validate_model_dir(path)
    if path.exists():
        raise ModelError(f"{path} is a file; expected a model directory (config.json + *.safetensors)")
    raise ModelError(f"unknown model {key!r}: not a known model name ({', '.join(REGISTRY)}) "
                     f"and not an existing directory")


def validate_model_dir(path: Path) -> Path:
    """Check the minimum an engine needs: config.json naming the architecture, and safetensors weights."""
    path = path.resolve()
    problems: list[str] = []
    config_file = path / "config.json"
    if not config_file.is_file():
        problems.append("config.json is missing")
    else:
        try:
            config = json.loads(config_file.read_text())
        except (ValueError, OSError) as exc:
            problems.append(f"config.json is not valid JSON ({exc})")
        else:
            if not isinstance(config, dict):
                problems.append("config.json is not a JSON object")
            else:
                archs = config.get("architectures")
                if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
                    problems.append('config.json has no "architectures" list (e.g. ["LlamaForCausalLM"])')
    if not any(path.glob("*.safetensors")):
        problems.append("no *.safetensors weight files")
    if problems:
        raise ModelError(f"{path} is not a usable HF model directory: " + "; ".join(problems))
    return path
