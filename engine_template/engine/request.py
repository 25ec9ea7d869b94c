"""A request's life in the engine, and the results handed back."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import SamplingParams


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS / stop token, included) or "length"


@dataclass(frozen=True)
class Score:
    token_logprobs: list[float]      # log p(token_i | everything before it)
    top_ids: list[list[int]]         # top-k token ids at each position
    top_logprobs: list[list[float]]


@dataclass
class Request:
    index: int
    prompt: list[int]
    params: SamplingParams
    max_total_len: int                # prompt + output may not exceed this
    stop_ids: frozenset[int]
    forced: list[int] | None = None   # teacher-forced continuation (scoring)
    top_k: int = 0
    generator: torch.Generator | None = None
    output: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    row: int = 0
    finish_reason: str | None = None
    token_logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)

    def slot(self, position: int, page_size: int) -> int:
        return self.pages[position // page_size] * page_size + position % page_size

    def append(self, token: int) -> None:
        self.output.append(token)
        if self.forced is not None:
            if len(self.output) == len(self.forced):
                self.finish_reason = "length"
        elif token in self.stop_ids:
            self.finish_reason = "stop"
        elif len(self.output) >= self.params.max_new_tokens or self.seq_len >= self.max_total_len:
            self.finish_reason = "length"
