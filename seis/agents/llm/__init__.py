"""LLM coding agents: `anthropic` (Claude, Messages API + tool use), `openai` (chat completions + function
calling; any OpenAI-compatible endpoint) and `cli` (an external agent such as `claude -p` or `codex exec`, run
headless in the workspace). One interface with the offline agent: edit(workspace, context) -> AgentResult.

    from seis.agents.llm import LLMAgent, LLMSettings
    agent = LLMAgent(LLMSettings("anthropic", model="claude-sonnet-4-5"), dev_benchmark=my_bench)
    result = agent.edit(workspace, context)   # + <session dir>/transcript.jsonl

SDKs are imported only when a session talks to them.
"""
from .settings import DEFAULT_MODELS, KEY_ENV, LLMSettings, check_ready, settings_from_config

__all__ = ["CliAgent", "DEFAULT_MODELS", "KEY_ENV", "LLMAgent", "LLMSettings", "SubprocessDevBenchmark",
           "check_ready", "make_llm_agent", "settings_from_config"]


def __getattr__(name: str):  # lazy: the agent modules pull in the tool layer and workspace code
    if name == "LLMAgent":
        from .agent import LLMAgent
        return LLMAgent
    if name == "CliAgent":
        from .cli_agent import CliAgent
        return CliAgent
    if name == "SubprocessDevBenchmark":
        from .devbench import SubprocessDevBenchmark
        return SubprocessDevBenchmark
    raise AttributeError(name)


def make_llm_agent(config):
    """The agent a RunConfig asks for (agent: anthropic | openai | cli), with the real dev benchmark (its
    'parent' row is each session's parent tree, bound at edit time)."""
    from .confine import AgentSandbox
    from .devbench import SubprocessDevBenchmark
    settings = settings_from_config(config)
    bench = SubprocessDevBenchmark(model=config.model, device=config.device, sizes=config.gate, seed=config.seed)
    sandbox = AgentSandbox(model_dir=_model_dir(config.model), device=config.device)
    if settings.backend == "cli":
        from .cli_agent import CliAgent
        return CliAgent(settings, bench, sandbox=sandbox)
    from .agent import LLMAgent
    return LLMAgent(settings, bench, sandbox=sandbox)


def _model_dir(name: str):
    """The run's model directory (shown read-only at /model in agent sandboxes), or None when not there."""
    try:
        from ..models import resolve_model
        return resolve_model(name, prepare=False)
    except Exception:  # noqa: BLE001 - not prepared yet, or not a model: the agent works without it
        return None
