"""Decode CUDA graphs: one graph per captured batch size, replayed with padded inputs.

The attention backend's host-side plan runs before every replay, outside the graph: it writes only into buffers
the graph captured.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Callable

import torch

from .batch import ForwardBatch


class DecodeGraphs:
    def __init__(self, forward: Callable[[ForwardBatch], torch.Tensor], plan: Callable[[ForwardBatch], None],
                 batch_sizes: list[int], page_width: int, device: torch.device):
        self.plan = plan
        self.batch_sizes = sorted(set(batch_sizes))
        max_bs = self.batch_sizes[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_slots = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.page_table = torch.zeros((max_bs, page_width), dtype=torch.int32, device=device)
        self.rows = torch.arange(max_bs, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.batch_sizes):  # largest first, so smaller graphs reuse its pool memory
            batch = self._static_batch(bs)
            plan(batch)
            for _ in range(2):  # warm up (Triton autotune / compile) outside capture
                forward(batch)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = forward(batch)
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def _static_batch(self, bs: int) -> ForwardBatch:
        # Host metadata of an all-padding batch (every row one token in the reserved page 0) for the capture.
        return ForwardBatch(is_decode=True, input_ids=self.input_ids[:bs], positions=self.positions[:bs],
                            out_slots=self.out_slots[:bs], seq_lens=self.seq_lens[:bs],
                            page_table=self.page_table[:bs], logit_rows=self.rows[:bs], seq_lens_host=(1,) * bs,
                            page_ids_host=((0,),) * bs, cuda_graph=True)

    def padded_size(self, bs: int) -> int | None:
        i = bisect.bisect_left(self.batch_sizes, bs)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def replay(self, packed: torch.Tensor, page_rows: torch.Tensor, bs: int, seq_lens: tuple[int, ...],
               page_ids: tuple[tuple[int, ...], ...]) -> torch.Tensor:
        """packed: [4, padded_bs] int64 (ids, positions, slots, seq_lens) on the device; page_rows: [padded_bs, W];
        seq_lens / page_ids: the same rows' host copies, for the attention plan."""
        padded = packed.shape[1]
        self.plan(dataclasses.replace(self._static_batch(padded), seq_lens_host=seq_lens, page_ids_host=page_ids))
        self.input_ids[:padded].copy_(packed[0])
        self.positions[:padded].copy_(packed[1])
        self.out_slots[:padded].copy_(packed[2])
        self.seq_lens[:padded].copy_(packed[3])
        self.page_table[:padded].copy_(page_rows)
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
