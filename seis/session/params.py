"""A run's configuration from flow parameters: a whole `config` (dict or RunConfig), fields given one at a time on
top of it, or a run directory to resume (its recorded config.json, which then wins). Validation is RunConfig's,
and its messages name the parameter to fix."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from ..config import RunConfig
from .rundir import RunDir


class ParameterError(ValueError):
    pass


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
        except ValidationError as e:
            raise ParameterError(f"{run.root}/config.json is not a valid run config: {_messages(e, flag)}") from None
        recorded = recorded.model_copy(update={"out": run.root})  # the run dir may have been moved
        wanted = _base(config) | given
        ignored = {k: v for k, v in wanted.items() if k != "out" and _differs(recorded, k, v)}
        if "out" in wanted and Path(wanted["out"]).expanduser().resolve() != run.root:
            raise ParameterError(f"out ({wanted['out']}) and resume ({run.root}) name different run directories")
        return Resolved(recorded, True, ignored)
    try:
        return Resolved(RunConfig(**(_base(config) | given)), False)
    except ValidationError as e:
        raise ParameterError(_messages(e, flag)) from None


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


def _messages(e: ValidationError, flag) -> str:
    return "; ".join(f"{flag('.'.join(str(p) for p in err['loc'])) if err['loc'] else 'config'}: {err['msg']}"
                     for err in e.errors())
