"""Paged KV cache: a pool of fixed-size pages per layer, a page allocator, and the request -> pages table."""
from __future__ import annotations

import torch


class KVCache:
    """K and V for every layer, stored as [num_pages * page_size, num_kv_heads, head_dim].

    Slot s belongs to page s // page_size. Page 0 is never handed out: padded rows of a CUDA-graph batch write
    and read there, so they cannot disturb live requests.
    """

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.page_size = page_size
        self.num_pages = num_pages
        shape = (num_pages * page_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class PageAllocator:
    def __init__(self, num_pages: int):
        self._free = list(range(num_pages - 1, 0, -1))  # page 0 is reserved; pop() hands out low ids first

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"KV cache full: need {n} pages, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def release(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


class PageTable:
    """Rows of page ids on the device, one row per running request (row 0 stays all-zero for padding)."""

    def __init__(self, max_requests: int, max_pages_per_request: int, device: torch.device):
        self.table = torch.zeros((max_requests + 1, max_pages_per_request), dtype=torch.int32, device=device)
        self._free_rows = list(range(max_requests, 0, -1))

    @property
    def width(self) -> int:
        return self.table.shape[1]

    def assign(self, pages: list[int]) -> int:
        row = self._free_rows.pop()
        self.table[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        return row

    def release(self, row: int) -> None:
        self.table[row].zero_()
        self._free_rows.append(row)
