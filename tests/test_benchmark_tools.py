"""The benchmark tools' own logic, on CPU: which engines a ladder run times (and its refusal of bad --engine
values before anything starts), a whole small ladder run with its engines' counters, and how the kernel profile
turns kernel intervals into GPU busy and idle time; the split-K projection kernel of scripts/bench_splitk.py against
its float32 reference under Triton's interpreter."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from seis.benchmarks import kernel_profile, labelled_dirs, ladder
from seis.engine_import import ENGINE_TEMPLATE
from seis.workspace import tree_hash

REPO = ENGINE_TEMPLATE.parent


def test_ladder_times_extra_engine_trees_under_their_labels(tmp_path):
    tree = tmp_path / "retained"
    shutil.copytree(ENGINE_TEMPLATE, tree)
    got = ladder.systems(["greedy-multistep-decode"], False, [], tmp_path / "work",
                         extra=labelled_dirs([f"from a run={tree}"]))
    assert list(got) == ["E0", "E0 + greedy-multistep-decode", "from a run"]
    copy, options = got["from a run"]   # measured from a copy taken before anything runs, named by its hash
    assert options == {} and copy != tree and tree_hash(copy) == tree_hash(tree)
    (tree / "engine" / "engine.py").write_text("edited while the ladder runs\n")
    assert tree_hash(copy) != tree_hash(tree)


@pytest.mark.slow
def test_a_ladder_run_reports_each_engines_counters_and_how_drafts_fared(tmp_path):
    out = tmp_path / "ladder.json"
    done = subprocess.run([sys.executable, "-m", "seis.benchmarks.ladder", "--model", "tiny-qwen3", "--order",
                           "greedy-multistep-decode,ngram-speculation", "--new-tokens", "48", "--prompt-len", "40",
                           "--reps", "3", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    speculative = "E0 + greedy-multistep-decode + ngram-speculation"
    assert list(result["engines"]) == ["E0", "E0 + greedy-multistep-decode", speculative]
    assert all(a == 48 for a in result["greedy_prefix_equal_to_e0"][speculative])  # lossless
    stats = result["engines"][speculative]["stats"]
    assert stats["verify_steps"] > 0 and stats["generated_tokens"] == 4 * 48       # warm-up + 3 repetitions
    assert "verify_steps" not in result["engines"]["E0"]["stats"]
    assert result["engines"]["E0"]["tree"] == tree_hash(ENGINE_TEMPLATE)  # each row names the tree it measured
    line = next(x for x in done.stdout.splitlines() if speculative in x)
    assert f"{stats['accepted_draft_tokens']}/{stats['draft_tokens']} tokens accepted" in line


@pytest.mark.parametrize("value, message", [
    ("no-equals-sign", "LABEL=DIR"), ("=/tmp/x", "LABEL=DIR"), ("label=", "LABEL=DIR"),
    ("x={missing}", "no engine/engine.py"), ("E0={template}", "is taken")])
def test_ladder_refuses_bad_engine_values(tmp_path, value, message):
    value = value.format(missing=tmp_path / "nothing", template=ENGINE_TEMPLATE)
    with pytest.raises(SystemExit, match=message):
        ladder.systems([], False, [], tmp_path, extra=labelled_dirs([value]))


@pytest.mark.parametrize("stats", [{"verify_steps": 3}, {"verify_steps": "3", "draft_tokens": 9,
                                                            "accepted_draft_tokens": "all"}])
def test_an_engines_draft_counters_cannot_lose_the_ladders_results(tmp_path, stats):
    """An --engine tree's stats are its own word: counters it left out or gave as text ended the run in a KeyError
    or TypeError while the table was printed, after every measurement and before --json was written."""
    summary = {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}
    result = {"new_tokens": 2, "greedy_prefix_equal_to_e0": {"E0": [2], "x": [2]}, "tok_per_s": {"E0": summary,
              "x": summary}, "speedup_vs_e0": {"E0": summary, "x": summary},
              "engines": {"E0": {"stats": {"attention_backend": "torch"}}, "x": {"stats": stats}}}
    assert "x" in ladder._table(result)


@pytest.mark.parametrize("reply", [[{"token_ids": "xy"}], ["ids"], [{"token_ids": [1, None]}], 7])
def test_a_ladder_engines_reply_counts_only_as_tokens_it_could_have_produced(reply):
    """As in versus: a string of --new-tokens characters passed the length check as that many tokens, and a reply
    that was no mapping with token ids ended in a traceback instead of the engine's error."""
    from seis.engine_host import EngineError

    class Engine:
        engine_dir = "tree"

        def generate(self, batch, sampling):
            return reply

    with pytest.raises(EngineError, match="not lists of at most 2 token ids"):
        ladder._timed_call(Engine(), "x", [[5]], None, 2)


@pytest.mark.slow
def test_a_batched_ladder_run_sends_every_request_of_a_call_together(tmp_path):
    # three requests on two slots: the third waits for a free slot, as post-validation's 40 do on 32
    out = tmp_path / "ladder.json"
    done = subprocess.run([sys.executable, "-m", "seis.benchmarks.ladder", "--model", "tiny-qwen3", "--order",
                           "greedy-multistep-decode", "--batch", "3", "--new-tokens", "24", "--prompt-len", "30",
                           "--max-batch-size", "2", "--max-seq-len", "512", "--reps", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["batch"] == 3 and "3 request(s) at once" in done.stdout
    # which attention each engine ran (E0 on CPU: torch), in the table's attention column
    header, *rows = [x for x in done.stdout.splitlines() if x.startswith(("engine ", "E0"))]
    column = header.index("attention")
    assert [r[column:].split()[0] for r in rows] == ["torch", "torch"]
    for name in ("E0", "E0 + greedy-multistep-decode"):
        stats = result["engines"][name]["stats"]
        assert stats["generated_tokens"] == 3 * 3 * 24                      # (warm-up + 2 calls) x 3 requests
        assert result["greedy_prefix_equal_to_e0"][name] == [24] * 9       # every request, E0's tokens
        options = result["engines"][name]["options"]
        assert (options["max_batch_size"], options["max_seq_len"]) == (2, 512)
    for args, message in ((["--batch", "0"], "--batch must be at least 1"),
                          (["--max-batch-size", "0"], "--max-batch-size must be at least 1"),
                          (["--max-seq-len", "200"], "is shorter than --prompt-len + --new-tokens")):
        refused = subprocess.run([sys.executable, "-m", "seis.benchmarks.ladder", *args], capture_output=True,
                                 text=True, timeout=120)
        assert refused.returncode != 0 and message in refused.stderr


def test_busy_time_is_the_union_of_kernel_intervals():
    # Overlapping kernels (programmatic dependent launch) count once; a kernel inside another adds nothing.
    iv = [(0.0, 2.0, "a"), (1.0, 3.0, "b"), (5.0, 6.0, "c"), (5.2, 5.8, "d"), (10.0, 11.0, "e")]
    assert kernel_profile.busy_us(iv) == pytest.approx(5.0)
    assert kernel_profile.busy_us([]) == 0.0


def test_idle_gaps_name_the_kernels_around_them():
    iv = [(0.0, 2.0, "gemv"), (1.0, 3.0, "attn"), (5.0, 6.0, "copy"), (5.2, 5.8, "inner"), (10.0, 11.0, "embed"),
          (12.0, 13.0, "gemv")]
    gaps = kernel_profile.idle_gaps(iv, 2)
    assert gaps == [{"us": 4.0, "after": "copy", "before": "embed"}, {"us": 2.0, "after": "attn", "before": "copy"}]
    # per 2 tokens: 4 us after "copy", 2 after "attn", 1 after "embed"
    assert kernel_profile.idle_after(iv, 2, 8) == {"copy": 2.0, "attn": 1.0, "embed": 0.5}


def test_kernel_profile_builds_its_stack_before_it_asks_for_a_device(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="not in the library: nope"):
        kernel_profile.main(["--stack", "triton-gemv,nope"])
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        kernel_profile.main(["--stack", "triton-gemv,greedy-multistep-decode"])  # the tree was built


def test_the_ablation_stubs_take_the_arguments_of_the_functions_they_replace():
    # In a fresh process: it imports the best stack's engine. A renamed or re-signed primitive must fail here, not
    # on the GPU.
    check = """
import inspect, sys, tempfile
from pathlib import Path
sys.path.insert(0, "scripts")
import bench_ablation as b
from seis.benchmarks.versus import engine_trees
tree = engine_trees([("s", b.BEST_STACK.split(","))], {}, [], Path(), Path(tempfile.mkdtemp()))["s"]
targets = b.stub_targets(tree)
for stubs in b.STUBS.values():
    for key, stub in stubs.items():
        params = inspect.signature(targets[key]).parameters.values()
        inspect.signature(stub).bind(*[p.name for p in params if p.default is inspect.Parameter.empty])
print(len(targets))
"""
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6"]


@pytest.mark.parametrize("extra", [",bounded-greedy-head", ",bounded-greedy-head,batched-bounded-greedy-head"])
def test_the_ablation_refuses_a_stack_it_cannot_stub(monkeypatch, extra):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import bench_ablation
    with pytest.raises(SystemExit, match="no stub for .*bounded-greedy-head"):
        bench_ablation.main(["--stack", bench_ablation.BEST_STACK + extra])


def test_ladder_builds_an_entry_alone_after_its_prerequisites(tmp_path):
    got = ladder.systems(["gate-up-silu-epilogue"], True, [], tmp_path)
    tree = got["E0 + gate-up-silu-epilogue"][0]
    assert (tree / "engine/kernels/triton_gemv.py").is_file()  # triton-gemv, a prerequisite, is in it
    assert "norm_linear_silu_mul" in (tree / "engine/model.py").read_text()


def test_the_split_k_projection_kernel_matches_its_reference_under_the_interpreter():
    """Every prologue (none, add-RMSNorm with its new residual, SiLU-and-mul), K split unevenly, 1 to 32 rows, the
    counters back at zero after each launch: what the GPU timings of bench_splitk.py rest on."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_splitk.py"), "--check"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "6 cases equal to the reference" in done.stdout


def test_the_attention_sweep_launches_its_own_tile_over_the_engines():
    """The engine passes a tile of its own (block_n, num_warps, mma); a sweep point must replace it, not be
    replaced by it, as functools.partial's stored keywords would be."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_attention_script", REPO / "scripts" / "bench_attention.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seen = []
    launch = script._with_tile(lambda *args, **kwargs: seen.append((args, kwargs)),
                               {"block_n": 64, "num_warps": 8, "mma": False})
    launch("q", "k", block_n=16, num_warps=4, mma=True, page_size=16)
    assert seen == [(("q", "k"), {"block_n": 64, "num_warps": 8, "mma": False, "page_size": 16})]


def test_a_benchmark_names_its_commit_and_says_when_the_checkout_differed(tmp_path, monkeypatch):
    from seis.provenance import source_commit

    monkeypatch.delenv("SEIS_COMMIT", raising=False)
    assert source_commit(tmp_path) == "unknown"  # no repository
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run(git + ["init", "-q"], check=True)
    code = tmp_path / "seis"
    code.mkdir()
    (code / "kernel.py").write_text("a = 1\n")
    (tmp_path / "README.md").write_text("text\n")
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "c"], check=True)
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert source_commit(tmp_path) == head
    (tmp_path / "versus.json").write_text("{}")  # a result written beside the code is not code that ran
    (tmp_path / "README.md").write_text("more text\n")
    assert source_commit(tmp_path) == head
    (code / "library").mkdir()
    (code / "library" / "patch.diff").write_text("+b = 2\n")  # a new entry, not yet committed
    assert source_commit(tmp_path) == head + "+changes"
    (code / "library" / "patch.diff").unlink()
    (code / "kernel.py").write_text("a = 3\n")
    assert source_commit(tmp_path) == head + "+changes"
    monkeypatch.setenv("SEIS_COMMIT", "abc1234")  # a copy without .git says where it came from
    assert source_commit(tmp_path) == "abc1234"


@pytest.mark.parametrize("bench", ["versus", "ladder", "engine_speed", "speculation", "kernel_profile"])
@pytest.mark.parametrize("where", ["missing folder", "a directory"])
def test_a_json_path_that_cannot_be_written_is_refused_before_anything_runs(bench, where, tmp_path, monkeypatch):
    """--json was first opened when the run had ended: a path in a folder that does not exist, or a directory,
    ended a run of many minutes (engines built, every repetition timed) in a traceback, and the ladder lost every
    figure it had measured (it writes the JSON before it prints its table)."""
    import importlib

    import seis.models
    module = importlib.import_module(f"seis.benchmarks.{bench}")

    def no_run(*args, **kwargs):
        raise AssertionError("the benchmark started before its --json was checked")

    monkeypatch.setattr(seis.models, "resolve_model", no_run)
    if bench == "speculation":
        monkeypatch.setattr(module, "measure", no_run)
    out = tmp_path / "nowhere" / "result.json" if where == "missing folder" else tmp_path
    with pytest.raises(SystemExit, match=f"--json {out}: "):
        module.main(["--json", str(out)])
    assert not (tmp_path / "nowhere").exists()


def test_a_figure_names_the_device_that_ran_it_and_its_weights(monkeypatch):
    """A run with --device cpu on a CUDA host was labelled with the GPU's name."""
    import torch

    from seis.provenance import device_label, weights_label
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert device_label("cpu") == "cpu"
    assert device_label("auto") == device_label("cuda:0") == "NVIDIA H200"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_label("auto") == "cpu"
    assert (weights_label("qwen3-0.6b-random"), weights_label("smollm2-135m-instruct"),
            weights_label("/some/hf/dir")) == ("random weights", "real weights", "local model")


def test_the_ladders_speedups_are_paired_per_repetition():
    """Each repetition's tok/s over E0's in the same repetition (they run interleaved): dividing by E0's median
    made a repetition slow for every engine at once (a busy machine) count as the engine's own spread."""
    from argparse import Namespace
    args = Namespace(model="tiny-qwen3", prompt_len=8, new_tokens=4, batch=1, reps=3)
    times = {"E0": [100.0, 50.0, 100.0], "E0 + x": [200.0, 100.0, 200.0]}
    tokens = {"E0": [[1, 2]], "E0 + x": [[1, 2]]}
    result = ladder._result(args, {"E0": {}, "E0 + x": {}}, tokens, times)
    s = result["speedup_vs_e0"]["E0 + x"]
    assert (s["min"], s["median"], s["max"]) == (2.0, 2.0, 2.0)
    assert result["weights"] == "random weights"
