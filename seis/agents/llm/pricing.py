"""USD per million tokens, by model name. The table holds list prices known when it was written; newer models
are deliberately absent (no guessed prices): a run prices them with RunConfig.agent_prices (a "default" entry
covers every unknown model), otherwise they cost $0 with a note, and a cost budget is refused for them."""
from __future__ import annotations

import re
from dataclasses import dataclass

PRICES: dict[str, tuple[float, float]] = {
    # Anthropic (input, output)
    "claude-opus-4-5": (5.0, 25.0), "claude-opus-4-1": (15.0, 75.0), "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4-5": (3.0, 15.0), "claude-sonnet-4": (3.0, 15.0), "claude-3-7-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0), "claude-3-5-haiku": (0.8, 4.0),
    # OpenAI
    "gpt-5": (1.25, 10.0), "gpt-5-mini": (0.25, 2.0), "gpt-5-nano": (0.05, 0.4),
    "gpt-4.1": (2.0, 8.0), "gpt-4.1-mini": (0.4, 1.6), "gpt-4.1-nano": (0.1, 0.4),
    "gpt-4o": (2.5, 10.0), "gpt-4o-mini": (0.15, 0.6), "o3": (2.0, 8.0), "o4-mini": (1.1, 4.4),
}
# A key prices the exact name, its dated snapshots (-20250514) and -latest; "gpt-5" does not price "gpt-5.5",
# nor "claude-sonnet-4" "claude-sonnet-4-6": a different model with maybe a different price.
_SUFFIX = re.compile(r"^(?:-\d{4}-?\d{2}-?\d{2}|-latest|@\d{8})?$")


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    source: str            # the table key that matched, "default", or "unknown"

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input_per_mtok + tokens_out * self.output_per_mtok) / 1e6

    @property
    def known(self) -> bool:
        return self.source != "unknown"

    @property
    def note(self) -> str:
        return "" if self.known else "model not in the pricing table (set agent_prices): cost counted as $0"


def price_for(model: str, overrides: dict[str, tuple[float, float]] | None = None) -> Price:
    table = {k.lower(): v for k, v in {**PRICES, **(overrides or {})}.items()}
    default = table.pop("default", None)
    name = model.lower().split("/")[-1]  # "anthropic/claude-..." names from OpenAI-compatible routers
    matches = [k for k in table if name.startswith(k) and _SUFFIX.match(name[len(k):])]
    if matches:
        key = max(matches, key=len)
        return Price(*map(float, table[key]), key)
    if default is not None:
        return Price(*map(float, default), "default")
    return Price(0.0, 0.0, "unknown")
