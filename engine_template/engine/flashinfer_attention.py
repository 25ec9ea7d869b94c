"""FlashInfer paged attention, as vanilla mini-sglang uses it: a paged prefill kernel for extend steps and a paged
decode kernel for decode steps, each planned on the host before the step (never inside a captured graph).

The KV cache's [slots, heads, dim] layout is FlashInfer's NHD paged layout viewed as [pages, page_size, heads, dim].
"""
from __future__ import annotations

import itertools

import torch

from .attention_backend import AttentionBackend
from .batch import ForwardBatch
from .kv_cache import KVCache

WORKSPACE_BYTES = 128 * 1024 * 1024  # split-KV partial results; FlashInfer's recommended size
FLASHINFER_HEAD_DIMS = (64, 128, 256)  # what its decode and merge kernels are built for
FLASHINFER_DTYPES = (torch.bfloat16, torch.float16)


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int, max_pages_per_request: int,
                 dtype: torch.dtype, device: torch.device):
        import flashinfer  # lazy: a CUDA-only package, optional

        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self._fi = flashinfer
        self.page_size, self.max_pages, self.dtype, self.device = page_size, max_pages_per_request, dtype, device
        # One float workspace for every wrapper: steps run one after another on one stream.
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.eager_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.graph_decode: dict[int, object] = {}  # batch size -> wrapper whose metadata buffers a graph captured
        self._active = None
        self._plan_copied = torch.cuda.Event()

    def plan(self, batch: ForwardBatch) -> None:
        # A plan stages its schedule in a pinned host buffer and copies it to the device asynchronously; the engine
        # plans the next decode step while this one runs, so wait until the last plan's copy has left that buffer.
        self._plan_copied.synchronize()
        self._plan(batch)
        self._plan_copied.record()

    def _plan(self, batch: ForwardBatch) -> None:
        indptr, indices, last_len = self._page_metadata(batch)
        common = dict(num_kv_heads=self.num_kv_heads, page_size=self.page_size, q_data_type=self.dtype,
                      kv_data_type=self.dtype)
        if not batch.is_decode:
            ext = torch.tensor((0, *itertools.accumulate(batch.extend_lens)), dtype=torch.int32, pin_memory=True)
            self.prefill.plan(ext, indptr, indices, last_len, self.num_heads, head_dim_qk=self.head_dim,
                              causal=True, **common)
            self._active = self.prefill
            return
        wrapper = self._graph_wrapper(batch.batch_size) if batch.cuda_graph else self.eager_decode
        wrapper.plan(indptr, indices, last_len, self.num_heads, head_dim=self.head_dim, **common)
        self._active = wrapper

    def _page_metadata(self, batch: ForwardBatch):
        """CSR page lists on the host (plan reads them there; the graph wrappers copy them into their buffers)."""
        counts = [len(p) for p in batch.page_ids_host]
        # Pinned, as vanilla mini-sglang's are: plan's copies to the device are DMAs, not staged by the driver.
        host = dict(dtype=torch.int32, pin_memory=True)
        indptr = torch.tensor([0, *itertools.accumulate(counts)], **host)
        indices = torch.tensor([i for pages in batch.page_ids_host for i in pages], **host)
        last_len = torch.tensor([s - (n - 1) * self.page_size for s, n in zip(batch.seq_lens_host, counts)], **host)
        return indptr, indices.to(self.device, non_blocking=True), last_len

    def _graph_wrapper(self, bs: int):
        if bs not in self.graph_decode:
            self.graph_decode[bs] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=self.device),
                paged_kv_indices_buffer=torch.zeros(bs * self.max_pages, dtype=torch.int32, device=self.device),
                paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=self.device))
        return self.graph_decode[bs]

    def forward(self, layer: int, q: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        paged = (kv.k[layer].view(-1, self.page_size, self.num_kv_heads, self.head_dim),
                 kv.v[layer].view(-1, self.page_size, self.num_kv_heads, self.head_dim))
        # Decode reads q through its strides (a view of the fused QKV output); prefill is given a packed copy.
        return self._active.run(q if batch.is_decode else q.contiguous(), paged).flatten(1)
