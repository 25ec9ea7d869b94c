"""What one forward step needs to know about the requests in it."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(kw_only=True)  # keywords only: six tensor fields in a row are easy to pass in the wrong order
class ForwardBatch:
    """Flattened tokens of one step.

    `decode` steps have exactly one new token per request. `extend` steps (prefill, M-row verification) have
    `extend_lens[i]` new tokens for request i, laid out one request after another.
    """

    is_decode: bool
    input_ids: torch.Tensor    # [T] int64
    positions: torch.Tensor    # [T] int64
    out_slots: torch.Tensor    # [T] int64: KV cache slot each new token's K/V is written to
    seq_lens: torch.Tensor     # [B] int32: KV length of each request after this step
    page_table: torch.Tensor   # [B, W] int32: pages of each request, in order
    logit_rows: torch.Tensor   # [R] int64: rows of the hidden states that need logits
    extend_lens: tuple[int, ...] = ()   # host copy, extend steps only
    seq_lens_host: tuple[int, ...] = ()  # host copy of seq_lens
    page_ids_host: tuple[tuple[int, ...], ...] = ()  # host copy: each request's pages covering its seq_len
    cuda_graph: bool = False            # the static batch of a captured decode graph

    @property
    def batch_size(self) -> int:
        return self.seq_lens.shape[0]
