"""Wait until the GPU runs nothing before a timed request starts.

Frozen engine processes stop issuing work, but kernels they queued before (or that one engine leaves running
after its reply, to slow the next engine down) still occupy the GPU. The timing process (the gate, post-validation)
holds a tiny CUDA context of its own and times a one-element kernel: while another context's kernels run, the device time-slices and the
probe takes milliseconds instead of microseconds. Three fast probes in a row mean idle. A GPU still busy after
MAX_WAIT_S (kernels left spinning by a frozen engine) is counted: a request timed on it is not a fair measurement
(the gate fails the candidate for it; post-validation flags the row).
"""
from __future__ import annotations

import time

PROBE_FAST_FACTOR = 4.0   # a probe within this factor of the idle baseline counts as "nothing else running"
PROBE_FLOOR_S = 200e-6
MAX_WAIT_S = 5.0


class GpuIdle:
    def __init__(self, device: str):
        self.waits = 0             # requests that found the GPU busy
        self.waited_s = 0.0
        self.never_idle = 0        # requests that started on a GPU still busy after MAX_WAIT_S
        self._torch = None
        if device == "cuda":
            import torch
            self._torch = torch
            self._x = torch.zeros(1, device="cuda")
            self._baseline = min(self._probe() for _ in range(20))

    def _probe(self) -> float:
        t0 = time.perf_counter()
        self._x.add_(1)
        self._torch.cuda.synchronize()
        return time.perf_counter() - t0

    def wait(self) -> None:
        """Return once the GPU is idle, or after MAX_WAIT_S (counted in never_idle), so that a device kept busy
        cannot hang the gate."""
        if self._torch is None:
            return
        limit = max(PROBE_FLOOR_S, PROBE_FAST_FACTOR * self._baseline)
        t0, fast, busy = time.perf_counter(), 0, False
        while fast < 3 and time.perf_counter() - t0 < MAX_WAIT_S:
            if self._probe() <= limit:
                fast += 1
            else:
                fast, busy = 0, True
        if busy:
            self.waits += 1
            self.waited_s += time.perf_counter() - t0
        if fast < 3:
            self.never_idle += 1
