"""Kernel timing as a decode step sees it: calls back to back inside one CUDA graph (launch overhead as under
graphs, no host in between), timed with CUDA events over repeated replays."""
from __future__ import annotations

import statistics
from collections.abc import Callable


def graph_us(fn: Callable[[int], object], calls: int, repeats: int = 5) -> float:
    """Median over `repeats` replays of one graph holding fn(0) .. fn(calls - 1), in microseconds per call.
    fn(i) may use i to pick its operands (e.g. cycle weights past the L2 cache, or one layer's KV cache each)."""
    import torch
    for i in range(2):  # compile / warm up outside the capture
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
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)
