"""A run's configuration from flow parameters: a whole `config` (dict or RunConfig), fields given one at a time on
top of it, or a run directory to resume (its recorded config.json, which then wins). Validation is RunConfig's,
and its messages name the parameter to fix; `run_param` carries RunConfig's description and bounds onto the flow
parameter of the same name, so a deployment's form shows them and the server refuses a value out of bounds."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Optional, TypeVar

from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ..run_config import RunConfig
from ..validation import describe_errors
from .rundir import RunDir


class ParameterError(ValueError):
    pass


_BOUNDS = ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern")


def described(text: str, **bounds: object) -> FieldInfo:
    """Annotated metadata of a flow parameter: its description and bounds. The description goes through
    json_schema_extra, which pydantic merges, because Prefect's own Field for each parameter sets one (from the
    docstring) that would replace a plain `description`."""
    return Field(description=text, json_schema_extra={"description": text}, **bounds)


def run_param(name: str) -> FieldInfo:
    """The flow parameter `name` as RunConfig defines it: its description (with the default, where it is a plain
    value) and its bounds, written once in RunConfig."""
    field = RunConfig.model_fields[name]
    bounds = {key: getattr(m, key) for m in field.metadata for key in _BOUNDS if getattr(m, key, None) is not None}
    text = field.description or name
    if field.default not in (None, PydanticUndefined):
        text += f" (default {field.default})"
    return described(text, **bounds)


F = TypeVar("F", bound=Callable)


def with_run_parameters(fn: F) -> F:
    """Give `fn(..., **fields)` one keyword parameter per RunConfig field, with RunConfig's type, description and
    bounds (an unset one is None: the config's value). Prefect reads a flow's parameters from its signature, so
    the run form, the server's schema check and the flow's validation all follow RunConfig, written once."""
    signature = inspect.signature(fn, eval_str=True)  # a module with postponed annotations holds strings
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fields = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                annotation=Annotated[Optional[f.annotation], run_param(name)])
              for name, f in RunConfig.model_fields.items()]
    fn.__signature__ = signature.replace(parameters=own + fields)
    return fn


@dataclass(frozen=True)
class Resolved:
    config: RunConfig
    resume: bool
    ignored: dict[str, object] = field(default_factory=dict)   # given with resume but differing from the record


def resolve_config(config: RunConfig | dict | None, overrides: dict[str, object],
                   resume: str | Path | None = None, flag=lambda name: name) -> Resolved:
    """`overrides`: field -> value (None: not given). `flag` names a field in messages (`--chains` in the CLI)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - set(RunConfig.model_fields))
    if unknown:
        raise ParameterError(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(RunConfig.model_fields)}")
    if resume is not None:
        run = RunDir.open(Path(resume))
        try:
            recorded = RunConfig.model_validate_json(run.recorded_config_json())
        except (OSError, UnicodeDecodeError) as e:  # unreadable, or bytes that are no text (a damaged disk, a copy)
            raise ParameterError(f"{run.root}/config.json is not a valid run config: {e}") from None
        except ValidationError as e:
            raise ParameterError(f"{run.root}/config.json is not a valid run config: "
                                 f"{describe_errors(e, flag)}") from None
        recorded = recorded.model_copy(update={"out": run.root})  # the run dir may have been moved
        wanted = _base(config) | given
        ignored = {k: v for k, v in wanted.items() if k != "out" and _differs(recorded, k, v)}
        if "out" in wanted and Path(wanted["out"]).expanduser().resolve() != run.root:
            raise ParameterError(f"out ({wanted['out']}) and resume ({run.root}) name different run directories")
        return Resolved(recorded, True, ignored)
    try:
        return Resolved(RunConfig(**(_base(config) | given)), False)
    except ValidationError as e:
        raise ParameterError(describe_errors(e, flag)) from None


def _base(config: RunConfig | dict | None) -> dict:
    if config is None:
        return {}
    if isinstance(config, RunConfig):
        return config.model_dump(exclude_unset=False)
    if not isinstance(config, dict):
        raise ParameterError(f"config must be a mapping of RunConfig fields, got {type(config).__name__}")
    return dict(config)


def _differs(recorded: RunConfig, name: str, value: object) -> bool:
    try:
        probe = RunConfig.model_validate({**recorded.model_dump(), name: value})
    except ValidationError:
        return True
    return getattr(probe, name) != getattr(recorded, name)
