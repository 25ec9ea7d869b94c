"""Post-validation freezes one engine's whole sandbox while the other is timed (or warmed up, or pinned). A freeze
that its processes resist (they resume each other, so SIGSTOPs keep missing some of them; on a host with a core for
each, the freeze gives up after 5 s) is that engine's doing, said as such: the candidate's an engine failure (no
result, as any misbehaviour of it), vanilla's a host failure; never an unexplained crash of the run."""
from __future__ import annotations

import pytest

from seis.engine_host import EngineError
from seis.evaluator import HostFailure
from seis.postval.run import time_sets
from seis.postval.speed import alone
from seis.sandbox import SandboxError


class _Box:
    """A sandbox whose freeze fails as SandboxedProcess.freeze does when its processes keep resuming each other."""

    def __init__(self, resists: bool):
        self.resists, self.frozen = resists, False

    def freeze(self) -> None:
        if self.resists:
            raise SandboxError("the sandbox's processes did not stay stopped for 5 s (3 kept running or were resumed)")
        self.frozen = True

    def thaw(self) -> bool:
        self.frozen = False
        return False


class _Engine:
    def __init__(self, name: str, resists: bool = False):
        self.engine_dir, self.box = name, _Box(resists)

    def pids(self) -> list[int]:
        return []


def test_a_candidate_that_resists_its_freeze_fails_post_validation_as_the_candidate():
    engines = {"candidate": _Engine("cand-dir", resists=True), "vanilla": _Engine("vanilla-dir")}
    with pytest.raises(EngineError, match="cand-dir: .*did not stay stopped"), alone(engines, "vanilla"):
        pass
    with pytest.raises(EngineError, match="cand-dir: .*did not stay stopped"):  # frozen to be pinned
        time_sets(engines, [], object, lambda ts: None)
    assert not engines["vanilla"].box.frozen


def test_vanilla_resisting_its_freeze_is_a_host_failure_never_the_candidates():
    engines = {"candidate": _Engine("cand-dir"), "vanilla": _Engine("vanilla-dir", resists=True)}
    with pytest.raises(HostFailure, match="vanilla-dir"), alone(engines, "candidate"):
        pass
    with pytest.raises(HostFailure, match="vanilla-dir"):
        time_sets(engines, [], object, lambda ts: None)
    assert not engines["candidate"].box.frozen
