"""What an LLM agent is told by the run configuration, and the checks made before any work starts."""
from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Backend = Literal["anthropic", "openai", "cli"]
Network = Literal["none", "api", "host"]
NETWORKS = ("none", "api", "host")

# Current, non-deprecated models of the installed SDKs; both are in the pricing table (pricing.py).
DEFAULT_MODELS: dict[str, str] = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5"}
# The SDKs read these themselves; we only check them up front so a run fails before any work, naming the var.
KEY_ENV: dict[str, tuple[str, ...]] = {"anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
                                       "openai": ("OPENAI_API_KEY",)}
BASE_URL_ENV: dict[str, str] = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}
# An SDK session's wall clock when the run sets none (agent_wall_s): turns alone do not bound time (each may run dev
# benchmarks and shell commands for many minutes, and a run may allow 10,000 turns). Below the session step's outer
# timeout (seis.session.timeouts.LLM_AGENT_S), so a session ends at it cleanly instead of stopping the run.
SDK_DEFAULT_WALL_S = 5 * 3600.0


@dataclass(frozen=True)
class LLMSettings:
    backend: Backend
    model: str | None = None                 # None: DEFAULT_MODELS[backend] (cli: a label only)
    base_url: str | None = None              # None: the SDK's env var, then its default
    max_turns: int = 50                      # API calls per session
    max_output_tokens: int = 8192            # per call; lowered when the token budget is nearly spent
    max_retries: int = 4                     # the SDKs' own retry-with-backoff on 429 / 5xx / connection errors
    request_timeout_s: float = 600.0
    prompt_template: str = "session_v1"      # a bundled template name or a file path
    prices: dict[str, tuple[float, ...]] = field(default_factory=dict)  # model prefix -> ($/Mtok in, out, ...)
    command: str | None = None               # cli: a bash command line run in the workspace
    wall_s: float | None = None              # whole-session wall-clock limit (cli: the command's timeout; None:
                                             # the cli's DEFAULT_WALL_S, the SDK agents' SDK_DEFAULT_WALL_S)
    shell_timeout_s: float = 300.0           # run_shell default (the model may ask for less, or up to 2x)
    network: Network = "none"                # cli: none | api (its API endpoints only, via a proxy) | host
    pass_env: tuple[str, ...] = ()           # cli: env var names handed to the cli process (its own API key)
    api_endpoints: tuple[str, ...] = ()      # cli, network "api": host:port (or URLs) it may reach

    @property
    def resolved_model(self) -> str:
        return self.model or DEFAULT_MODELS.get(self.backend, self.backend)


def settings_from_config(config) -> LLMSettings:
    """LLMSettings from a RunConfig (duck-typed so this module does not import pydantic models)."""
    return LLMSettings(backend=config.agent, model=config.agent_model, base_url=config.agent_base_url,
                       max_turns=config.max_turns, max_retries=config.agent_max_retries,
                       prompt_template=config.prompt_template, prices=dict(config.agent_prices),
                       command=config.agent_command, wall_s=config.agent_wall_s,
                       network=getattr(config, "agent_network", "none"),
                       pass_env=tuple(getattr(config, "agent_pass_env", ()) or ()),
                       api_endpoints=tuple(getattr(config, "agent_api_endpoints", ()) or ()))


def check_ready(settings: LLMSettings, environ: dict[str, str] | None = None,
                max_cost_usd: float | None = None) -> None:
    """Raise ValueError saying what to fix: a missing API key (by env var), a missing or unknown cli command,
    an unreadable prompt template. Touches nothing but the environment and the file system."""
    env = os.environ if environ is None else environ
    if settings.network not in NETWORKS:
        raise ValueError(f"agent_network must be one of {', '.join(NETWORKS)}, not {settings.network!r}")
    if settings.backend != "cli" and (settings.network != "none" or settings.pass_env or settings.api_endpoints):
        raise ValueError("agent_network, agent_pass_env and agent_api_endpoints apply to the cli agent only: an "
                         "SDK agent's key stays in SEIS and its tools never have a network")
    bad = [n for n in settings.pass_env if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", n)]
    if bad:
        raise ValueError(f"agent_pass_env holds names that are not environment variable names: {bad}")
    if settings.backend == "cli" and settings.network == "api":
        if not api_endpoints(settings, env):
            raise ValueError("agent_network='api' needs the endpoint(s) to allow: set agent_api_endpoints "
                             "(host:port), agent_base_url, or pass the tool's key / *_BASE_URL in agent_pass_env")
    from ...sandbox import SandboxUnavailable, bwrap_version
    try:
        bwrap_version()  # every agent-run process lives in the sandbox: no sandbox, no LLM session
    except SandboxUnavailable as e:
        raise ValueError(f"LLM agents run their commands only inside the SEIS sandbox, which is unavailable: {e}")
    if settings.backend in KEY_ENV:
        names = KEY_ENV[settings.backend]
        if not any(env.get(n) for n in names):
            raise ValueError(f"agent {settings.backend!r} needs an API key: set {names[0]} in the environment"
                             + (f" (or {' / '.join(names[1:])})" if len(names) > 1 else ""))
        from .pricing import price_for
        if max_cost_usd is not None and not price_for(settings.resolved_model, settings.prices).known:
            raise ValueError(f"max_cost_usd needs a price for model {settings.resolved_model!r}, which is not in "
                             "the pricing table: set agent_prices, e.g. {\"" + settings.resolved_model
                             + "\": [IN, OUT]} in USD per million input / output tokens")
    elif settings.backend == "cli":
        if not settings.command or not settings.command.strip():
            raise ValueError("agent 'cli' needs a command: set agent_command (or SEIS_AGENT_COMMAND), "
                             "e.g. 'claude -p --permission-mode acceptEdits'")
        program = _program(settings.command)
        if program is not None and shutil.which(program) is None and not Path(program).is_file():
            raise ValueError(f"agent 'cli': command {program!r} not found on PATH")
    else:
        raise ValueError(f"{settings.backend!r} is not an LLM agent backend")
    from .prompt import load_template
    load_template(settings.prompt_template)  # raises with the path when missing or malformed


def _program(command: str) -> str | None:
    """The executable a simple command line starts (None when the line is too shell-ish to tell)."""
    if any(c in command for c in "|;&$`()<>\n"):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # leading VAR=value assignments
        words = words[1:]
    return words[0] if words and words[0] not in {"env", "exec", "time", "nice", "timeout"} else None


# Where a provider's CLI goes when no base URL is configured (agent_network="api" allows exactly these).
OFFICIAL_ENDPOINTS = {"ANTHROPIC": "api.anthropic.com:443", "OPENAI": "api.openai.com:443"}


def api_endpoints(settings: LLMSettings, environ=None) -> list[str]:
    """The endpoints a cli agent may reach under agent_network="api": agent_api_endpoints when given, else the
    agent_base_url, else the *_BASE_URL variables it is handed, else the official API of each provider whose
    key it is handed."""
    from .netproxy import endpoint
    env = os.environ if environ is None else environ
    if settings.api_endpoints:
        return sorted({endpoint(e) for e in settings.api_endpoints})
    if settings.base_url:
        return [endpoint(settings.base_url)]
    urls = [env[k] for k in settings.pass_env if k.endswith("_BASE_URL") and env.get(k)]
    if urls:
        return sorted({endpoint(u) for u in urls})
    return sorted({v for k, v in OFFICIAL_ENDPOINTS.items() if any(n.startswith(k) for n in settings.pass_env)})
