"""USD per million tokens, by model name, with the providers' cache prices. The table holds list prices known
when it was written; newer models are deliberately absent (no guessed prices): a run prices them with
RunConfig.agent_prices (a "default" entry covers every unknown model), otherwise they cost $0 with a note, and a
cost budget is refused for them.

How the providers bill cached prompts (and how Price.cost applies it):
- Anthropic: cache reads (`cache_read_input_tokens`) at 0.1x the input price, 5-minute cache writes
  (`cache_creation_input_tokens`) at 1.25x, 1-hour writes at 2x; `input_tokens` excludes both.
- OpenAI: `prompt_tokens` includes `prompt_tokens_details.cached_tokens`, which are billed at the model's
  cached-input price (0.1x for GPT-5, 0.25x for GPT-4.1 / o3 / o4-mini, 0.5x for GPT-4o); no write charge.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ANTHROPIC_CACHE_READ, ANTHROPIC_CACHE_WRITE_5M, ANTHROPIC_CACHE_WRITE_1H = 0.1, 1.25, 2.0


def _claude(inp: float, out: float) -> tuple[float, float, float, float, float]:
    return (inp, out, inp * ANTHROPIC_CACHE_READ, inp * ANTHROPIC_CACHE_WRITE_5M, inp * ANTHROPIC_CACHE_WRITE_1H)


def _gpt(inp: float, out: float, cached: float) -> tuple[float, float, float, float, float]:
    return (inp, out, cached, inp, inp)  # OpenAI has no cache writes: a "write" is a plain input token


# (input, output, cache read, cache write 5 min, cache write 1 h), USD per million tokens.
PRICES: dict[str, tuple[float, ...]] = {
    # Anthropic list prices, as of 2026-11 (platform.claude.com/docs/en/about-claude/pricing)
    "claude-opus-4-6": _claude(5.0, 25.0), "claude-opus-4-5": _claude(5.0, 25.0),
    "claude-opus-4-1": _claude(15.0, 75.0), "claude-opus-4": _claude(15.0, 75.0),
    "claude-sonnet-4-6": _claude(3.0, 15.0),   # the anthropic backend's default model (released 2026-02-17)
    "claude-sonnet-4-5": _claude(3.0, 15.0), "claude-sonnet-4": _claude(3.0, 15.0),
    "claude-3-7-sonnet": _claude(3.0, 15.0),
    "claude-haiku-4-5": _claude(1.0, 5.0), "claude-3-5-haiku": _claude(0.8, 4.0),
    # OpenAI list prices (standard tier), as of 2026-11 (the OpenAI API pricing page)
    "gpt-5": _gpt(1.25, 10.0, 0.125),         # the openai backend's default model
    "gpt-5-mini": _gpt(0.25, 2.0, 0.025), "gpt-5-nano": _gpt(0.05, 0.4, 0.005),
    "gpt-4.1": _gpt(2.0, 8.0, 0.5), "gpt-4.1-mini": _gpt(0.4, 1.6, 0.1), "gpt-4.1-nano": _gpt(0.1, 0.4, 0.025),
    "gpt-4o": _gpt(2.5, 10.0, 1.25), "gpt-4o-mini": _gpt(0.15, 0.6, 0.075),
    "o3": _gpt(2.0, 8.0, 0.5), "o4-mini": _gpt(1.1, 4.4, 0.275),
}
# A key prices the exact name, its dated snapshots (-20250514) and -latest; "gpt-5" does not price "gpt-5.5",
# nor "claude-sonnet-4" "claude-sonnet-4-6": a different model with maybe a different price.
_SUFFIX = re.compile(r"^(?:-\d{4}-?\d{2}-?\d{2}|-latest|@\d{8})?$")


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    source: str                          # the table key that matched, "default", or "unknown"
    cache_read_per_mtok: float | None = None    # None: the input price
    cache_write_per_mtok: float | None = None   # 5-minute writes; None: the input price
    cache_write_1h_per_mtok: float | None = None

    def cost(self, tokens_in: int, tokens_out: int, cache_read: int = 0, cache_write: int = 0,
             cache_write_1h: int = 0) -> float:
        """tokens_in: input tokens at the full price (not the cached ones, which are the other counts)."""
        cr = self.input_per_mtok if self.cache_read_per_mtok is None else self.cache_read_per_mtok
        cw = self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        cw1 = self.input_per_mtok if self.cache_write_1h_per_mtok is None else self.cache_write_1h_per_mtok
        return (tokens_in * self.input_per_mtok + tokens_out * self.output_per_mtok + cache_read * cr
                + cache_write * cw + cache_write_1h * cw1) / 1e6

    @property
    def known(self) -> bool:
        return self.source != "unknown"

    @property
    def note(self) -> str:
        return "" if self.known else "model not in the pricing table (set agent_prices): cost counted as $0"


def _price(values, source: str) -> Price:
    """(in, out) prices cached tokens at the input price (never under-counting); (in, out, cache read,
    cache write[, cache write 1 h]) is explicit."""
    v = [float(x) for x in values]
    if len(v) not in (2, 4, 5):
        raise ValueError(f"price for {source!r} must be (in, out) or (in, out, cache_read, cache_write[, "
                         f"cache_write_1h]) in USD per million tokens, got {values!r}")
    extra = v[2:] + [None] * (3 - len(v[2:]))
    if len(v) == 4:
        extra[2] = v[3]  # one write price given: it covers both cache lifetimes
    return Price(v[0], v[1], source, *extra)


def price_for(model: str, overrides: dict[str, tuple[float, ...]] | None = None) -> Price:
    table = {k.lower(): v for k, v in {**PRICES, **(overrides or {})}.items()}
    default = table.pop("default", None)
    name = model.lower().split("/")[-1]  # "anthropic/claude-..." names from OpenAI-compatible routers
    matches = [k for k in table if name.startswith(k) and _SUFFIX.match(name[len(k):])]
    if matches:
        key = max(matches, key=len)
        return _price(table[key], key)
    if default is not None:
        return _price(default, "default")
    return Price(0.0, 0.0, "unknown")
