"""The evaluator on CPU with tiny-qwen3: E0 passes against itself, each broken candidate is rejected by its own
named check, bad input is refused clearly, and the isolation it claims is what the engine process sees."""
from __future__ import annotations

import json
import math
import os
import resource
import sys
import textwrap
from pathlib import Path

import pytest

import seis.evaluator
from pydantic import ValidationError
from typer.testing import CliRunner

from seis.engine_host import EngineProcess
from seis.engine_import import ENGINE_TEMPLATE
from seis.evaluator import GateInputError, GateResult, SpeedConfig, run_dev_benchmark, run_gate
from seis.evaluator.checks import forced_stats, greedy_agreement, topk_kl, tolerance
from seis.evaluator.engines import GenerationOut, ScoreOut
from seis.evaluator.gate import evaluator_source_sha256
from seis.evaluator.snapshot import snapshot, tree_sha256
from seis.evaluator.workloads import load_gate_workloads
from seis.models import resolve_model

import evaluator_helpers as H

@pytest.fixture(scope="session")
def prepared(prepared_dir: Path) -> Path:
    return prepared_dir


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return resolve_model("tiny-qwen3")


@pytest.fixture(scope="module")
def e0_gate(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> GateResult:
    """E0 vs a copy of E0, with speed on and a parent that reports what its process can see."""
    tmp = tmp_path_factory.mktemp("e0")
    candidate = H.copy_engine(tmp / "candidate")
    secrets = (prepared / "gsm8k_test.jsonl", prepared / "manifest.json",
               Path(seis.evaluator.__file__).parent / "gate_config.py")
    assert all(p.exists() for p in secrets)
    parent = H.introspecting(H.copy_engine(tmp / "parent"), secrets)
    speed = SpeedConfig(n_prompts=1, natural_max_new_tokens=8, fixed_max_new_tokens=8)
    with pytest.MonkeyPatch.context() as mp:  # must not reach the engine processes
        mp.setenv("https_proxy", "http://127.0.0.1:9")
        mp.setenv("SEIS_TEST_PRIVATE", "1")
        return run_gate(H.tiny_config(prepared, candidate, parent=parent, speed=speed))


def _failed(result: GateResult) -> set[str]:
    return set(result.failed_checks)


# --- E0 against itself ----------------------------------------------------------------------------------------------
def test_e0_copy_passes_every_check(e0_gate: GateResult) -> None:
    assert e0_gate.verdict == "pass", e0_gate.failed_checks
    names = {c.name for c in e0_gate.checks}
    for split in ("dev", "heldout"):
        for path in ("decode", "verify"):
            assert {f"{split}.{path}.kl", f"{split}.{path}.top1", f"{split}.{path}.ppl_ratio"} <= names
        assert {f"{split}.answered", f"{split}.lengths", f"{split}.eos", f"{split}.greedy_exact",
                f"{split}.greedy_valid"} <= names
    assert {"dev_heldout.consistency", "eos_probe.stops", "engine.build", "engine.timeout"} <= names
    kl = next(c for c in e0_gate.checks if c.name == "dev.decode.kl")
    assert kl.value == pytest.approx(0.0, abs=1e-6) and kl.extra["positions"] == kl.extra["expected_positions"] > 0
    # The EOS probe found prompts to test with (the tiny model does emit EOS), so that check is not vacuous.
    assert e0_gate.counts["eos_probes"] > 0
    assert not next(c for c in e0_gate.checks if c.name == "eos_probe.stops").skipped


def test_result_records_calibration_hashes_and_round_trips(e0_gate: GateResult) -> None:
    cal = e0_gate.calibration
    assert cal is not None and cal.positions > 0
    th = H.tiny_config(Path("."), Path(".")).thresholds
    assert cal.noise["kl"] < 1e-6  # CPU fp32: batched vs alone is (nearly) bit-identical
    assert cal.tolerance["kl"] == th.kl_floor and cal.tolerance["top1"] == th.top1_floor
    h = e0_gate.hashes
    assert h.candidate_tree == h.reference_tree == tree_sha256(ENGINE_TEMPLATE)
    assert h.parent_tree not in (None, h.candidate_tree)
    assert h.evaluator_source == evaluator_source_sha256()
    assert all(len(v) == 64 for v in (h.workloads, h.workloads_manifest, h.thresholds, h.config))
    again = GateResult.model_validate_json(e0_gate.model_dump_json())
    assert again == e0_gate
    tampered = json.loads(e0_gate.model_dump_json())
    tampered["checks"][0]["passed"] = False
    with pytest.raises(ValidationError, match="failed_checks"):
        GateResult.model_validate(tampered)


def test_speed_is_interleaved_with_ratios(e0_gate: GateResult) -> None:
    speed = e0_gate.speed
    assert speed is not None and speed.reps == 3
    assert speed.pinned_cpu in os.sched_getaffinity(0)  # the three engine processes shared one CPU
    # one at a time, and the natural workload as whole batches (serving throughput), capped at max_batch_size
    assert {w.name: w.batch for w in speed.workloads} == {"dev-natural@8": 1, "dev-fixed256@8": 1,
                                                          "dev-natural@8-batch16": 16}
    batched = next(w for w in speed.workloads if w.batch > 1)
    assert batched.n_prompts == 16
    assert any(c.name.startswith("timed.dev-natural@8-batch16") for c in e0_gate.checks)  # its outputs are checked
    for wl in speed.workloads:
        rows = {r.engine: r for r in speed.rows if r.workload == wl.name}
        assert set(rows) == {"candidate", "parent", "vanilla"}
        for r in rows.values():
            assert r.error is None and r.tok_per_s.n == 3 and r.tok_per_s.min <= r.tok_per_s.median <= r.tok_per_s.max
            assert r.latency_ms.median > 0
        cand = rows["candidate"]
        assert cand.vs_vanilla > 0 and cand.vs_parent > 0 and rows["parent"].vs_vanilla > 0
        assert rows["vanilla"].vs_vanilla is None and rows["parent"].vs_parent is None
    fixed = next(r for r in speed.rows if r.workload == "dev-fixed256@8" and r.engine == "candidate")
    assert fixed.tokens_per_pass == 8  # ignore_eos: exactly max_new_tokens for the one prompt
    # every timed request began on an idle device (on CPU trivially); one that did not would fail the gate
    idle = next(c for c in e0_gate.checks if c.name == "speed.gpu_idle")
    assert idle.passed and idle.value == 0 == speed.gpu_never_idle and idle.upper == 0
    assert not speed.parent_is_vanilla and "parent" in e0_gate.engine_stats  # another tree: its own engine


def test_a_parent_that_is_vanillas_tree_is_timed_once_as_vanilla(prepared: Path, tmp_path: Path) -> None:
    """Session 0 of a chain: the parent is vanilla's exact tree. No third engine starts; vanilla's rows stand for
    the parent (ratio 1 between them), and the candidate's ratio over its parent is its ratio over vanilla."""
    speed = SpeedConfig(n_prompts=1, natural_max_new_tokens=8, fixed_max_new_tokens=8, batch_size=2)
    result = run_gate(H.tiny_config(prepared, H.copy_engine(tmp_path / "candidate"),
                                    parent=H.copy_engine(tmp_path / "parent"), speed=speed))
    assert result.verdict == "pass", result.failed_checks
    assert result.hashes.parent_tree == result.hashes.reference_tree and result.parent is not None
    assert set(result.engine_stats) == {"candidate", "vanilla"}     # two engine processes, not three
    table = result.speed
    assert table.parent_is_vanilla
    for wl in table.workloads:
        rows = {r.engine: r for r in table.rows if r.workload == wl.name}
        assert list(rows) == ["candidate", "parent", "vanilla"]
        assert rows["parent"].tok_per_s == rows["vanilla"].tok_per_s and rows["parent"].vs_vanilla == 1.0
        assert rows["vanilla"].vs_parent == 1.0
        assert rows["candidate"].vs_parent == rows["candidate"].vs_vanilla is not None


class _ScriptedEngine:
    """Answers every request with `tokens` tokens after `seconds` (one call may be made slow); logs call order."""

    usable, failures = True, []

    def __init__(self, name: str, seconds: float, log: list, slow_call: int | None = None):
        self.name, self.seconds, self.log, self.slow_call, self.calls = name, seconds, log, slow_call, 0
        self.frozen = False

    def pids(self) -> list[int]:
        return []

    def running(self) -> bool:
        return True

    def freeze(self) -> None:
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    def generate(self, prompts, sampling):
        import time

        assert not self.frozen, "a frozen engine was asked to work"
        self.calls += 1
        self.log.append(self.name)
        time.sleep(self.seconds * (20 if self.calls == self.slow_call else 1))
        return [GenerationOut(token_ids=[7] * 8, finish_reason="length")]


def test_a_gpu_that_never_goes_idle_is_counted(monkeypatch) -> None:
    """Kernels a frozen engine left spinning outlast the idle wait: the request then starts on a busy GPU, and
    that is counted (the gate fails the candidate on it: check speed.gpu_idle) instead of passing unnoticed."""
    from seis.engine_host import gpu_idle
    from seis.engine_host.gpu_idle import GpuIdle

    monkeypatch.setattr(gpu_idle, "MAX_WAIT_S", 0.05)
    probes = {"busy": True}
    idle = GpuIdle("cpu")
    idle._torch, idle._baseline = object(), 10e-6
    idle._probe = lambda: 5e-3 if probes["busy"] else 10e-6   # a busy device time-slices: milliseconds
    idle.wait()
    assert (idle.waits, idle.never_idle) == (1, 1)
    probes["busy"] = False
    idle.wait()
    assert (idle.waits, idle.never_idle) == (1, 1)   # idle at once: neither a wait nor unfair


def test_an_engine_that_resists_freezing_is_killed_and_fails() -> None:
    """It could run beside the engine being timed, whether it kept running when frozen or ran while frozen: the
    candidate's is a recorded failure, the reference's stops the gate."""
    from seis.evaluator.engines import EngineHandle
    from seis.evaluator.errors import ReferenceFailure
    from seis.sandbox import SandboxError

    class Box:
        def freeze(self):
            raise SandboxError("the sandbox's processes did not stay stopped for 5 s (2 kept running or were resumed)")

        def thaw(self):
            return True  # one of its processes ran while it was frozen (it had the kernel resume it)

    class Proc:
        box, killed = Box(), False

        def kill(self):
            self.killed = True

    for step, says in (("freeze", "did not stay stopped"), ("thaw", "ran while it was frozen")):
        for trusted in (False, True):
            handle = EngineHandle.__new__(EngineHandle)
            handle.role, handle.trusted, handle.failures, handle.proc = "candidate", trusted, [], Proc()
            if trusted:
                with pytest.raises(ReferenceFailure, match=says):
                    getattr(handle, step)()
            else:
                getattr(handle, step)()
                assert [f.op for f in handle.failures] == ["freeze"] and says in str(handle.failures[0])
            assert handle.proc.killed


def test_speed_interleaves_per_request_and_pairs_ratios() -> None:
    from seis.engine_host.client import Sampling
    from seis.evaluator.speed import measure_speed
    from seis.evaluator.workloads import PromptSet, SpeedWorkload

    log: list[str] = []
    # Candidate twice as fast as parent and vanilla; one parent request is 20x slow (a host hiccup).
    engines = {"candidate": _ScriptedEngine("candidate", 0.01, log),
               "parent": _ScriptedEngine("parent", 0.02, log, slow_call=5),
               "vanilla": _ScriptedEngine("vanilla", 0.02, log)}
    def prompt_set(rep: int) -> PromptSet:  # fresh prompts in every repetition
        return PromptSet(f"rep{rep}", ("a", "b", "c"), tuple((rep, i) for i in range(3)),
                         (Sampling(max_new_tokens=8),) * 3)
    wl = SpeedWorkload("dev-natural@3", "d", prompt_set(-1).subset([]), tuple(prompt_set(r) for r in range(3)))
    table, timed = measure_speed(engines, (wl,), SpeedConfig(warmup_requests=0), device="cpu")
    # While one engine works the others are frozen (asserted inside generate); every output is kept for checks.
    assert [len(rep) for rep in timed.outputs["dev-natural@3"]["candidate"]] == [3, 3, 3]
    # Per request, every engine runs back to back, the order rotating by request and repetition.
    assert log[:9] == ["candidate", "parent", "vanilla", "parent", "vanilla", "candidate",
                       "vanilla", "candidate", "parent"]
    assert log[9:12] == ["parent", "vanilla", "candidate"]  # repetition 2 starts one step further
    rows = {r.engine: r for r in table.rows}
    assert rows["candidate"].vs_vanilla == pytest.approx(2.0, rel=0.25)
    # The slow request drags one pass of the parent down, but not the median of paired ratios.
    assert rows["parent"].tok_per_s.min < 0.5 * rows["parent"].tok_per_s.max
    assert rows["candidate"].vs_parent == pytest.approx(2.0, rel=0.25)
    assert rows["parent"].vs_vanilla == pytest.approx(1.0, rel=0.25)


def test_gate_warm_ups_run_on_every_cpu_and_only_timed_requests_share_one(engine_pid) -> None:
    """First calls compile kernels, and FlashInfer's nvcc and ninja inherit the caller's CPU mask: the gate's
    warm-ups run unpinned, its timed requests with every engine on one CPU."""
    from seis.engine_host.client import Sampling
    from seis.evaluator.speed import measure_speed
    from seis.evaluator.workloads import PromptSet, SpeedWorkload

    everywhere = os.sched_getaffinity(engine_pid)
    masks: dict[str, list[set[int]]] = {"warm": [], "timed": []}

    class Watched(_ScriptedEngine):
        def pids(self) -> list[int]:
            return [engine_pid]

        def generate(self, prompts, sampling):
            masks["warm" if prompts[0] == [-1] else "timed"].append(os.sched_getaffinity(engine_pid))
            return super().generate(prompts, sampling)

    log: list[str] = []
    engines = {n: Watched(n, 0.001, log) for n in ("candidate", "parent", "vanilla")}
    warm = PromptSet("warm", ("w",), ([-1],), (Sampling(max_new_tokens=8),))
    timed = PromptSet("rep0", ("a",), ([1],), (Sampling(max_new_tokens=8),))
    wl = SpeedWorkload("dev-natural@1", "d", warm, (timed, timed))
    table, _ = measure_speed(engines, (wl, wl), SpeedConfig(), device="cpu")
    assert len(masks["warm"]) == 6 and all(m == everywhere for m in masks["warm"])
    assert len(masks["timed"]) == 12 and all(m == {table.pinned_cpu} for m in masks["timed"])
    assert table.pinned_cpu in everywhere and os.sched_getaffinity(engine_pid) == everywhere


def test_the_references_compile_cache_serves_one_running_engine_at_a_time(tmp_path, monkeypatch) -> None:
    """Each sandbox takes ownership of its writable cache: a second reference alive at once (two gates on one
    host) must get a directory of its own, empty (the first may be writing half a kernel), not the shared one."""
    from seis.engine_host.jit_cache import held_cache, trusted_cache

    monkeypatch.setenv("SEIS_CACHE", str(tmp_path / "seis"))
    tree = "ab" * 32
    with held_cache(tree, tmp_path / "spare-1") as first:
        assert first == trusted_cache(tree)
        (first / "kernel.so").write_bytes(b"compiled")
        with held_cache(tree, tmp_path / "spare-2") as second:
            assert second == tmp_path / "spare-2" and not any(second.iterdir())
    with held_cache(tree, tmp_path / "spare-3") as again:  # released: the next gate finds what was compiled
        assert again == first and (again / "kernel.so").read_bytes() == b"compiled"


def test_an_untrusted_engines_cache_is_seeded_only_from_a_cache_no_engine_is_writing(tmp_path, monkeypatch) -> None:
    """A candidate's private cache is a copy of the reference's, but not while another gate's reference runs there:
    it may be writing half a kernel (or removing a temporary mid-copy), which the copy would hand on as whole."""
    from seis.engine_host.jit_cache import held_cache, seeded_cache, trusted_cache

    monkeypatch.setenv("SEIS_CACHE", str(tmp_path / "seis"))
    tree = "cd" * 32
    (trusted_cache(tree) / "kernel.so").write_bytes(b"compiled")
    with held_cache(tree, tmp_path / "spare"):  # another gate's reference, alive
        busy = seeded_cache(tmp_path / "while-held", tree)
        assert busy == tmp_path / "while-held" and not any(busy.iterdir())
    idle = seeded_cache(tmp_path / "after", tree)
    assert (idle / "kernel.so").read_bytes() == b"compiled"
    with held_cache(tree, tmp_path / "spare-2") as reference:  # the copy let go of the lock: the reference gets it
        assert reference == trusted_cache(tree)


def test_a_gate_seeds_its_candidates_cache_before_its_reference_holds_the_one_it_copies(tmp_path, monkeypatch) -> None:
    """Whatever the order of the roles, the candidate's copy is made while the gate's own reference does not yet
    hold the cache (else every candidate would start empty), and the reference then holds it."""
    from contextlib import ExitStack
    from types import SimpleNamespace

    from seis.engine_host.jit_cache import trusted_cache
    from seis.evaluator.gate import _cache_dirs

    monkeypatch.setenv("SEIS_CACHE", str(tmp_path / "seis"))
    tree = "ef" * 32
    (trusted_cache(tree) / "kernel.so").write_bytes(b"compiled")
    setup = SimpleNamespace(snaps={"vanilla": SimpleNamespace(sha256=tree)}, cache_root=tmp_path)
    with ExitStack() as held:
        dirs = _cache_dirs(setup, ["vanilla", "candidate", "parent"], {"vanilla"}, held)
        assert dirs["vanilla"] == trusted_cache(tree)
        for role in ("candidate", "parent"):
            assert dirs[role] == tmp_path / f"cache-{role}" and (dirs[role] / "kernel.so").read_bytes() == b"compiled"


# An engine in a real engine sandbox that, on its first warm-up request, starts a helper process and a thread that
# keep trying to widen their CPU masks, tries to widen its own on every timed request (and starts a thread), and
# answers each timed request with the mask of every thread of every process of its sandbox (its own PID
# namespace's /proc).
WIDENING_ENGINE = """
    import json, os, subprocess, sys, threading, time
    EVERYWHERE = set(EVERYWHERE_CPUS)
    def widen():
        try:
            os.sched_setaffinity(0, EVERYWHERE)
        except OSError:
            pass
    def keep_widening():
        while True:
            widen()
            time.sleep(0.01)
    HELPER = ('import os, time\\nwhile True:\\n    try:\\n        os.sched_setaffinity(0, %r)\\n'
              '    except OSError:\\n        pass\\n    time.sleep(0.01)\\n' % EVERYWHERE)
    started = []
    def masks():
        seen = {}
        for pid in filter(str.isdigit, os.listdir('/proc')):
            try:
                tids = os.listdir(f'/proc/{pid}/task')
            except OSError:
                continue
            for tid in tids:
                try:
                    seen[f'{pid}/{tid}'] = sorted(os.sched_getaffinity(int(tid)))
                except OSError:
                    pass
        return seen
    for line in sys.stdin:
        if line.strip() == 'warm':
            if not started:
                started.append(subprocess.Popen([sys.executable, '-c', HELPER]))
                threading.Thread(target=keep_widening, daemon=True).start()
            print('{}', flush=True)
        else:
            widen()
            threading.Thread(target=time.sleep, args=(600,), daemon=True).start()   # started while timed
            print(json.dumps(masks()), flush=True)
"""


class _WideningEngine:
    """WIDENING_ENGINE in an engine sandbox, as the gate (freeze, thaw, pids, generate) and post-validation (box,
    pids, generate) drive an engine; keeps the masks each timed request saw. Warm-up prompts are [-1]."""

    usable, failures = True, []

    def __init__(self, tmp_path: Path, name: str):
        from seis.engine_host.policy import engine_policy, forbidden_paths
        from seis.sandbox import SandboxedProcess

        for d in ("engine", "model"):
            (tmp_path / name / d).mkdir(parents=True)
        policy = engine_policy(tmp_path / name / "engine", tmp_path / name / "model", "cpu")
        code = textwrap.dedent(WIDENING_ENGINE).replace("EVERYWHERE_CPUS", repr(sorted(os.sched_getaffinity(0))))
        self.box = SandboxedProcess([sys.executable, "-c", code], policy, forbidden=forbidden_paths())
        self.proc = self.box.start()
        self.timed: list[dict[str, list[int]]] = []
        self.engine_dir = name

    def pids(self) -> list[int]:
        return self.box.members()

    def freeze(self) -> None:
        self.box.freeze()

    def thaw(self) -> None:
        assert not self.box.thaw(), "ran while frozen"

    def running(self) -> bool:
        return True

    def generate(self, prompts, sampling):
        self.proc.stdin.write(b"warm\n" if prompts[0] == [-1] else b"timed\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        if prompts[0] != [-1]:
            self.timed.append(reply)
        return [GenerationOut(token_ids=[7] * 8, finish_reason="length") for _ in prompts]

    def kill(self) -> None:
        self.box.kill()


@pytest.mark.parametrize("timing", ["gate", "postval"])
def test_every_thread_of_a_timed_engine_stays_on_the_pinned_cpu_whatever_it_started_or_widened(
        tmp_path: Path, timing: str) -> None:
    """The timed engines share one CPU so that the candidate and vanilla see the same CPU. A candidate that started
    a helper process during the warm-up (listed before it, it was never pinned) or widened its own mask again
    (sched_setaffinity needs no privilege) ran its host side on every CPU while vanilla had one. Now every engine
    is listed and pinned after the warm-up, frozen meanwhile, and an engine sandbox cannot change its mask; since
    it cannot, what it started while pinned gets the host's mask back afterwards."""
    from types import SimpleNamespace

    from seis.engine_host.client import Sampling
    from seis.evaluator.speed import measure_speed
    from seis.evaluator.workloads import PromptSet, SpeedWorkload
    from seis.postval.run import time_sets

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a pinned mask cannot be told from an unpinned one")
    names = ("candidate", "vanilla")
    engines: dict[str, _WideningEngine] = {}
    try:
        for name in names:
            engines[name] = _WideningEngine(tmp_path, name)
        if timing == "gate":
            warm = PromptSet("warm", ("w",), ([-1],), (Sampling(max_new_tokens=8),))
            rep = PromptSet("rep0", ("a",), ([1],), (Sampling(max_new_tokens=8),))
            table, _ = measure_speed(engines, (SpeedWorkload("dev-natural@1", "d", warm, (rep, rep)),),
                                     SpeedConfig(), device="cpu")
            cpu = table.pinned_cpu
        else:
            def time_one(ts) -> None:
                for name in names:
                    engines[name].generate([[1]], Sampling(max_new_tokens=8))

            sets = [SimpleNamespace(warmup=[SimpleNamespace(tokens=(-1,))])]
            _, cpu = time_sets(engines, sets, Sampling, time_one)
        assert cpu is not None
        for name in names:
            timed = engines[name].timed
            assert len(timed) == 2 if timing == "gate" else len(timed) == 1
            for masks in timed:
                # bwrap's init, the engine (its main thread and the widening one), the helper process
                assert len({key.split("/")[0] for key in masks}) >= 3 and len(masks) >= 4, masks
                assert all(mask == [cpu] for mask in masks.values()), (name, cpu, masks)
            # afterwards every thread gets its mask back, those started while pinned too (the engine cannot)
            tids = [int(t) for pid in engines[name].pids() for t in os.listdir(f"/proc/{pid}/task")]
            assert all(os.sched_getaffinity(t) == os.sched_getaffinity(0) for t in tids)
    finally:
        for engine in engines.values():
            engine.kill()


def test_timed_processes_share_one_cpu_and_get_their_masks_back() -> None:
    import subprocess
    import sys

    from seis.engine_host.affinity import pinned_together

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        before = [os.sched_getaffinity(p.pid) for p in procs]
        with pinned_together([p.pid for p in procs]) as cpu:
            assert cpu in os.sched_getaffinity(0)  # the highest free one (other tests may be timing too)
            assert all(os.sched_getaffinity(p.pid) == {cpu} for p in procs)
        assert [os.sched_getaffinity(p.pid) for p in procs] == before
    finally:
        for p in procs:
            p.kill()


def test_timings_at_once_on_one_host_take_cpus_of_their_own_and_release_them() -> None:
    """Two workers' gates on one host must not time their engines on one CPU together. CPU numbers no real
    timing uses keep the leases of other tests running at the same time out of this one."""
    from seis.engine_host.affinity import _lease

    cpus = {9000, 9001}
    first, held_first = _lease(cpus)
    second, held_second = _lease(cpus)
    assert (first, second) == (9001, 9000) and held_first and held_second
    shared, none = _lease(cpus)
    assert (shared, none) == (9001, None)  # every CPU leased: the last is shared
    held_first.close()
    again, held_again = _lease(cpus)
    assert again == 9001 and held_again  # released with its socket
    for lease in (held_second, held_again):
        lease.close()


def test_engine_process_runs_isolated_from_a_snapshot(e0_gate: GateResult) -> None:
    iso, seen = e0_gate.isolation, e0_gate.engine_stats["parent"]
    assert "RLIMIT_AS" in iso.memory_limit and seen["probe_rlimit_as"] == iso.memory_limit_bytes
    from seis.sandbox.cgroup import can_cage
    # the whole sandbox bounded by a memory cgroup where the host allows one, else by the memory watch (both are
    # tried in test_clean_failure.py and test_sandbox.py: the sandbox sees its own cgroup namespace, not the bound)
    assert iso.sandbox_memory_bytes and iso.memory_limit.startswith("memory cgroup" if can_cage() else "memory watch")
    assert seen["probe_oom_score_adj"] == "1000"   # the OOM killer's first choice, before anything of the host's
    assert "bubblewrap" in iso.sandbox and iso.frozen_while_timed
    assert {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"} <= set(seen["probe_env"])
    assert not {"https_proxy", "SEIS_TEST_PRIVATE"} & set(seen["probe_env"])
    assert seen["probe_interfaces"] == ["lo"]
    # Held-out data and the evaluator's thresholds are never mounted in engine processes.
    assert seen["probe_secrets_visible"] == []
    # It ran from a private read-only copy at /engine, not from the directory it was given.
    assert seen["probe_engine_file"].startswith("/engine/")
    assert e0_gate.hashes.trees_unchanged


# --- broken candidates: each rejected by its own check --------------------------------------------------------------
BROKEN = {
    "skip_layer": (H.skip_last_layer, "dev.decode.kl"),
    "perturbed_logits": (H.perturb_logits, "dev.verify.kl"),
    "dropped_requests": (H.drop_requests, "dev.answered"),
    # held-out shapes ignore EOS, so a cut output there is a length violation (dev outputs now end at EOS)
    "truncated_outputs": (H.truncate_outputs, "heldout.lengths"),
    "eos_ignored": (H.ignore_eos, "eos_probe.stops"),
    "import_error": (H.import_error, "engine.build"),
    "build_error": (H.build_error, "engine.build"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_candidate_is_rejected_by_its_check(name: str, prepared: Path, tmp_path: Path) -> None:
    breaker, check = BROKEN[name]
    result = run_gate(H.tiny_config(prepared, breaker(H.copy_engine(tmp_path / name))))
    assert result.verdict == "fail"
    assert check in _failed(result), result.failed_checks
    failed = next(c for c in result.checks if c.name == check)
    assert failed.detail and (failed.value is None or failed.lower is not None or failed.upper is not None)
    if name == "import_error":
        assert "engine_dependency_that_does_not_exist" in failed.detail
    if name == "build_error":
        assert "weights in an unexpected layout" in failed.detail
    if name in ("skip_layer", "perturbed_logits"):
        assert failed.value > failed.upper * 5  # far outside, not a borderline call
    if name == "dropped_requests":
        assert "replies for" in failed.detail


@pytest.mark.slow
def test_hang_in_build_times_out(prepared: Path, tmp_path: Path) -> None:
    cand = H.hang_in_build(H.copy_engine(tmp_path / "hang"))
    cfg = H.tiny_config(prepared, cand)
    cfg = cfg.model_copy(update={"isolation": cfg.isolation.model_copy(update={"build_timeout_s": 10})})
    result = run_gate(cfg)
    assert result.verdict == "fail" and "engine.timeout" in _failed(result)
    assert "within 10 s" in next(c for c in result.checks if c.name == "engine.timeout").detail
    assert result.wall_s < 60


@pytest.mark.slow
@pytest.mark.parametrize("when", ["after_build", "before_speed"])
def test_a_candidate_that_ends_on_its_own_between_calls_fails_and_says_so(when: str, prepared: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate that ends on its own between two calls of the gate: right after its build reply (the gate then
    skipped every correctness check, since it was not usable, and passed it on its engine and tree checks alone),
    or after its last correctness reply (the timing and every timed check were skipped: a pass that no timed output
    backs). Nothing was recorded either time. Its ending is its failure, named in engine.errors."""
    import signal
    import time

    import seis.evaluator.gate as gate

    def until_ended(proc) -> None:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    cand = H.copy_engine(tmp_path / "quits")
    if when == "after_build":  # it exits as soon as its build reply is out
        H.after_each_reply(cand, "import os\nos._exit(0)")
        built = gate.start_and_build

        def build_then_let_it_end(handles):
            built(handles)
            until_ended(next(h for h in handles if h.role == "candidate").proc.proc)

        monkeypatch.setattr(gate, "start_and_build", build_then_let_it_end)
    else:  # it ends (SIGTERM: not the OOM killer's way) once its correctness calls are answered
        checked = gate.run_correctness

        def check_then_end_it(ref, candidate, *args):
            outcome = checked(ref, candidate, *args)
            for pid in candidate.pids():
                os.kill(pid, signal.SIGTERM)
            until_ended(candidate.proc.proc)
            return outcome

        monkeypatch.setattr(gate, "run_correctness", check_then_end_it)
    speed = SpeedConfig(n_prompts=1, natural_max_new_tokens=8, fixed_max_new_tokens=8)
    result = run_gate(H.tiny_config(prepared, cand, speed=speed))
    assert result.verdict == "fail" and "engine.errors" in _failed(result), result.failed_checks
    assert "engine process is not running" in next(c for c in result.checks if c.name == "engine.errors").detail


@pytest.fixture(scope="module")
def dev_reference(prepared: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The dev prompts exactly as the gate encodes them, and the reference's greedy outputs for them. The gates
    that use them ask the same prompts (H.TEST_NONCE): an engine that has not seen a gate's nonce cannot know its
    dev prompts."""
    cfg = H.tiny_config(prepared, ENGINE_TEMPLATE)
    wl = load_gate_workloads(cfg, model_dir)
    options = {"device": "cpu", "max_seq_len": wl.budget.max_seq_len, "max_batch_size": cfg.max_batch_size}
    with EngineProcess(ENGINE_TEMPLATE, model_dir, options) as ref:
        ref.build()
        outs = ref.generate(wl.dev.prompt_lists(), list(wl.dev.sampling))
    return wl, {p: (o["token_ids"], o["finish_reason"]) for p, o in zip(wl.dev.prompts, outs)}


@pytest.mark.slow
def test_outputs_hardcoded_for_dev_prompts_fail_on_heldout(dev_reference, prepared: Path, tmp_path: Path) -> None:
    _, baked = dev_reference
    result = run_gate(H.tiny_config(prepared, H.hardcode_outputs(H.copy_engine(tmp_path / "baked"), baked)))
    assert result.verdict == "fail"
    assert {"heldout.greedy_exact", "heldout.greedy_valid"} <= _failed(result)
    valid = next(c for c in result.checks if c.name == "heldout.greedy_valid")
    assert valid.value < 0.5  # made-up tokens are not what the reference would pick
    assert not [n for n in _failed(result) if n.startswith("dev.")]  # indistinguishable from E0 on dev alone


@pytest.mark.slow
def test_dev_only_behaviour_fails_consistency(dev_reference, prepared: Path, tmp_path: Path) -> None:
    wl, _ = dev_reference
    cand = H.dev_only_batches(H.copy_engine(tmp_path / "devonly"), list(wl.dev.prompts))
    result = run_gate(H.tiny_config(prepared, cand))
    assert result.verdict == "fail"
    assert "dev_heldout.consistency" in _failed(result)
    assert not [n for n in _failed(result) if n.startswith("dev.")]


# --- bad input -------------------------------------------------------------------------------------------------------
def _refusal(prepared: Path, candidate: Path, **kw) -> str:
    with pytest.raises(GateInputError) as info:
        run_gate(H.tiny_config(prepared, candidate, **kw))
    return str(info.value)


def test_bad_input_is_refused_with_a_clear_reason(prepared: Path, tmp_path: Path) -> None:
    assert "does not exist" in _refusal(prepared, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    assert "no engine package" in _refusal(prepared, tmp_path / "empty")
    assert "unknown model 'no-such-model'" in _refusal(prepared, ENGINE_TEMPLATE, model="no-such-model")
    assert "prepared" in _refusal(tmp_path / "nowhere", ENGINE_TEMPLATE)


@pytest.mark.parametrize("plant, reason", [
    (lambda d: (d / "seis").mkdir(), "own 'seis' module"),
    (lambda d: (d / "sitecustomize.py").write_text("print('hi')\n"), "sitecustomize.py is not allowed"),
    (lambda d: (d / "engine" / "usercustomize.py").write_text(""), "usercustomize.py is not allowed"),
    (lambda d: (d / "evil.pth").write_text("import os\n"), "evil.pth is not allowed"),
    (lambda d: (d / "conftest.py").write_text(""), "conftest.py is not allowed"),
    (lambda d: (d / "engine" / "outside.py").symlink_to("/etc/hostname"), "engine/outside.py is a symlink"),
    (lambda d: (d / "engine" / ".dvcignore").write_text("*\n"), "engine/.dvcignore is a version-control or DVC"),
])
def test_unsafe_workspace_is_refused(plant, reason: str, prepared: Path, tmp_path: Path) -> None:
    cand = H.copy_engine(tmp_path / "ws")
    plant(cand)
    assert reason in _refusal(prepared, cand)


def test_a_refused_tree_is_named_as_the_operator_gave_it(tmp_path: Path) -> None:
    """The tree is validated in its private copy, but the refusal names the directory passed (`seis gate
    --candidate DIR`), not the gate's scratch copy of it: the message pointed at /tmp/seis-gate-*/candidate,
    which is gone by the time the operator reads it."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(GateInputError) as info:
        snapshot(tmp_path / "empty", tmp_path / "copy")
    assert f"candidate dir {(tmp_path / 'empty').resolve()} has no engine package" in str(info.value)
    cand = H.copy_engine(tmp_path / "ws")
    (cand / "conftest.py").write_text("")
    with pytest.raises(GateInputError) as info:
        snapshot(cand, tmp_path / "copy2", what="parent")
    assert str(info.value).startswith(f"parent dir {cand.resolve()}: conftest.py is not allowed"), info.value


@pytest.mark.slow
def test_cli_exit_codes(prepared: Path, tmp_path: Path) -> None:
    from seis.cli import app

    runner = CliRunner()
    missing = runner.invoke(app, ["gate", "--candidate", str(tmp_path / "nope"), "--model", "tiny-qwen3"])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    unknown = runner.invoke(app, ["gate", "--candidate", str(ENGINE_TEMPLATE), "--model", "no-such-model",
                                  "--prepared-dir", str(prepared)])
    assert unknown.exit_code == 2 and "unknown model" in unknown.output

    cand = H.truncate_outputs(H.copy_engine(tmp_path / "trunc"))
    out = tmp_path / "gate.json"
    res = runner.invoke(app, ["gate", "--candidate", str(cand), "--model", "tiny-qwen3", "--device", "cpu",
                              "--quick", "--prepared-dir", str(prepared), "--json", str(out)])
    assert res.exit_code == 1, res.output
    assert "VERDICT: FAIL" in res.output and "dev.lengths" in res.output
    assert "vanilla E0's attention backend: torch" in res.output  # E0 on CPU
    assert GateResult.model_validate_json(out.read_text()).verdict == "fail"


# --- the agents' dev benchmark -------------------------------------------------------------------------------------
def test_dev_benchmark_returns_only_the_dev_speed_table(prepared: Path, tmp_path: Path) -> None:
    cand = H.copy_engine(tmp_path / "cand")
    speed = SpeedConfig(n_prompts=1, natural_max_new_tokens=6, fixed_max_new_tokens=6)
    result = run_dev_benchmark(H.tiny_config(prepared, cand, speed=speed))
    assert not result.errors
    assert {r.engine for r in result.speed.rows} == {"candidate", "vanilla"}
    assert all(w.name.startswith("dev-") for w in result.speed.workloads)
    dumped = result.model_dump_json()
    for secret in ("heldout", "gsm8k-test", "threshold", "tolerance", "calibration", "shape:"):
        assert secret not in dumped


# --- pure pieces ---------------------------------------------------------------------------------------------------
def test_topk_kl_properties() -> None:
    ids, lps = [1, 2, 3], [math.log(0.6), math.log(0.3), math.log(0.05)]
    assert topk_kl(ids, lps, ids, lps) == pytest.approx(0.0, abs=1e-12)
    sharper = [math.log(0.9), math.log(0.05), math.log(0.03)]
    assert topk_kl(ids, lps, ids, sharper) > 0.1  # mass moved onto the top token is caught (via the rest bucket)
    # A token missing from the candidate's top-k is bounded by its k-th log-prob: finite, positive.
    missing = topk_kl(ids, lps, [1, 2, 9], [math.log(0.6), math.log(0.3), math.log(0.01)])
    assert 0 < missing < 1
    assert tolerance(0.02, 5, 1e-3, 0.5) == 0.02 and tolerance(0.02, 5, 0.01, 0.5) == 0.05
    assert tolerance(0.02, 5, 1.0, 0.5) == 0.5 and tolerance(0.02, 5, math.nan, 0.5) == 0.5


def test_agreement_and_forced_stats_count_missing_replies() -> None:
    ref = [GenerationOut(token_ids=[1, 2, 3], finish_reason="length")] * 2
    agree = greedy_agreement(ref, [GenerationOut(token_ids=[1, 2, 4], finish_reason="length")])
    assert agree.exact_rate == 0.0 and agree.mean_first_divergence == 1.0
    s = ScoreOut(token_logprobs=[-0.1, -0.2], top_ids=[[1, 2], [3, 4]], top_logprobs=[[-0.1, -3.0], [-0.2, -2.0]])
    full = forced_stats([s, s], [s, s])
    assert full.kl == 0 and full.top1 == 1 and full.ppl_ratio == 1
    half = forced_stats([s, s], [s])
    assert half.positions == 2 and half.expected_positions == 4 and half.top1 == 0.5


@pytest.mark.parametrize("bad", [math.inf, math.nan, 0.5])
def test_a_score_reply_with_an_impossible_log_probability_is_malformed(bad: float) -> None:
    """+inf in the candidate's top-k made the KL sum -inf, which topk_kl clamps to 0: the most sensitive numerics
    check read a perfect score. A log-probability above 0, NaN or +inf is no reply at all (the candidate fails the
    call); -inf, a probability of 0, is one."""
    ref = ScoreOut(token_logprobs=[-0.5], top_ids=[[1, 2]], top_logprobs=[[-0.5, -1.5]])
    for where in ("top_logprobs", "token_logprobs"):
        reply = {"token_logprobs": [-0.5], "top_ids": [[1, 2]], "top_logprobs": [[-0.5, -1.5]]}
        reply[where] = [[bad, -1.5]] if where == "top_logprobs" else [bad]
        with pytest.raises(ValidationError, match="less than or equal"):
            ScoreOut.model_validate(reply)
    zero = ScoreOut(token_logprobs=[-0.5], top_ids=[[1, 2]], top_logprobs=[[-0.5, -math.inf]])
    assert forced_stats([ref], [zero]).kl > 0


@pytest.mark.parametrize("reply", [None, 0, {}, {"eos_token_ids": "2"}, {"eos_token_ids": [[]] * 100_000}])
def test_a_build_reply_that_is_not_one_fails_the_build_and_is_not_kept(reply, model_dir: Path) -> None:
    """The build reply was kept as the engine sent it: null read as 'not built' with no failure recorded (the
    engine.build check failed with the detail 'built'), anything else as built, and all of it stayed in the
    gate's memory while the gate ran (64 MiB of a reply: a GB of lists). It is a mapping holding a short list of
    EOS ids, kept with the plain stats and nothing else; anything else is a malformed reply."""
    from seis.evaluator.engines import Deadline, EngineHandle
    from seis.evaluator.errors import ReferenceEngineFailure
    from seis.evaluator.isolation import Isolation

    def handle(trusted: bool, answer) -> EngineHandle:
        h = EngineHandle("candidate", ENGINE_TEMPLATE, model_dir, {"device": "cpu"}, Isolation(sandbox="test"),
                         Deadline(60), 60, 60, trusted=trusted)
        h.proc.build = lambda timeout_s=None: answer
        return h

    bad = handle(False, reply)
    assert bad.build() is None and bad.build_info is None
    assert [f.op for f in bad.failures] == ["build"] and "malformed reply" in bad.failures[0].message
    with pytest.raises(ReferenceEngineFailure, match="malformed reply"):
        handle(True, reply).build()
    good = handle(False, {"eos_token_ids": [2], "stats": {"n": 1}, "padding": [[]] * 100_000})
    assert good.build() is not None and not good.failures
    assert good.build_info.eos_token_ids == [2] and good.build_info.stats == {"n": 1}
    assert "padding" not in good.build_info.model_dump()


def test_snapshot_is_a_private_hashed_copy(tmp_path: Path) -> None:
    src = H.copy_engine(tmp_path / "src")
    before = tree_sha256(src)
    (src / "engine" / "__pycache__").mkdir(exist_ok=True)
    (src / "engine" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    assert tree_sha256(src) == before  # caches do not count
    snap = snapshot(src, tmp_path / "snap")
    assert snap.sha256 == before and snap.path != src
    (src / "engine" / "engine.py").write_text("# changed after the snapshot\n")
    assert tree_sha256(src) != before and tree_sha256(snap.path) == before
    assert not (snap.path / "engine" / "__pycache__").exists()
    os.symlink(src / "engine" / "model.py", src / "engine" / "alias.py")  # even an in-tree link is refused
    with pytest.raises(GateInputError, match="symlink"):
        snapshot(src, tmp_path / "snap2")
    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY  # the gate never limits itself
