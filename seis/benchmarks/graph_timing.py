"""Kernel timing as a decode step sees it: calls back to back inside one CUDA graph (launch overhead as under
graphs, no host in between), timed with CUDA events over repeated replays."""
from __future__ import annotations

import statistics
from collections.abc import Callable


def graph_times(fn: Callable[[int], object], calls: int, repeats: int = 5, replays: int = 1) -> list[float]:
    """Microseconds per call, sorted, of `repeats` timings of one graph holding fn(0) .. fn(calls - 1), each timing
    `replays` replays back to back. fn(i) may use i to pick its operands (e.g. cycle weights past the L2 cache, or
    one layer's KV cache each)."""
    import torch
    for i in range(min(2, calls)):  # compile / warm up outside the capture
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / (calls * replays))
    return sorted(times)


def graph_us(fn: Callable[[int], object], calls: int, repeats: int = 5) -> float:
    """Median of graph_times: microseconds per call."""
    return statistics.median(graph_times(fn, calls, repeats))
