"""Turns, tokens, dollars and seconds spent by one session, and whether any limit is reached."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .conversation import Usage
from .pricing import Price

MIN_OUTPUT_TOKENS = 256  # below this a turn can't do useful work: the budget counts as spent
WARN_FRACTION = 0.2      # tell the model to wrap up when less than this share of a limit is left


@dataclass
class Meter:
    price: Price
    max_turns: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_wall_s: float | None = None
    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    cache_read: int = 0
    cache_write: int = 0
    unknown_usage: int = 0        # replies without usage: their tokens and cost are unknown, not 0
    t0: float = field(default_factory=time.monotonic)

    def add(self, usage: Usage | None) -> None:
        self.turns += 1
        if usage is None:
            self.unknown_usage += 1
            return
        self.tokens_in += usage.tokens_in
        self.tokens_out += usage.output
        self.cache_read += usage.cache_read
        self.cache_write += usage.cache_write + usage.cache_write_1h
        self.cost_usd += self.price.cost(usage.input, usage.output, usage.cache_read, usage.cache_write,
                                         usage.cache_write_1h)

    @property
    def deadline(self) -> float | None:
        return None if self.max_wall_s is None else self.t0 + self.max_wall_s

    def time_left(self) -> float | None:
        return None if self.max_wall_s is None else self.max_wall_s - self.wall_s

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.t0

    def _left(self) -> dict[str, float]:
        """Share of each set limit still left (0..1)."""
        left = {}
        if self.max_turns:
            left["turns"] = 1 - self.turns / self.max_turns
        if self.max_tokens:
            left["tokens"] = 1 - self.tokens / self.max_tokens
        if self.max_cost_usd:
            left["cost"] = 1 - self.cost_usd / self.max_cost_usd
        if self.max_wall_s:
            left["wall clock"] = 1 - self.wall_s / self.max_wall_s
        return left

    def exhausted(self) -> str | None:
        """Why no further API call may be made, or None."""
        if self.unknown_usage and (self.max_tokens is not None or self.max_cost_usd is not None):
            return (f"token usage unknown: {self.unknown_usage} API repl{'y' if self.unknown_usage == 1 else 'ies'} "
                    "carried no usage (or a count below 0, NaN or infinite), so the token / cost budget cannot be enforced")
        if self.max_turns is not None and self.turns >= self.max_turns:
            return f"turn budget spent ({self.turns} of {self.max_turns} turns)"
        if self.max_tokens is not None and self.max_tokens - self.tokens < MIN_OUTPUT_TOKENS:
            return f"token budget spent ({self.tokens:,} of {self.max_tokens:,} tokens)"
        if self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd:
            return f"cost budget spent (${self.cost_usd:.4f} of ${self.max_cost_usd:.2f})"
        if self.max_wall_s is not None and self.wall_s >= self.max_wall_s:
            return f"wall-clock budget spent ({self.wall_s:.0f} of {self.max_wall_s:.0f} s)"
        return None

    def output_cap(self, default: int) -> int:
        """Max output tokens of the next call: never more than the token budget has left."""
        if self.max_tokens is None:
            return default
        return max(1, min(default, self.max_tokens - self.tokens))

    def warning(self) -> str | None:
        low = {k: v for k, v in self._left().items() if v < WARN_FRACTION}
        if not low:
            return None
        return ("Budget nearly spent (" + ", ".join(f"{k}: {max(v, 0):.0%} left" for k, v in low.items())
                + "). Wrap up and call finish soon; an unfinished session keeps whatever the tree holds.")

    def summary(self) -> dict:
        return {"turns": self.turns, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                "cache_read_tokens": self.cache_read, "cache_write_tokens": self.cache_write,
                "unknown_usage_turns": self.unknown_usage, "cost_usd": round(self.cost_usd, 6),
                "wall_s": round(self.wall_s, 3)}
