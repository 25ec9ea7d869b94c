"""The side-by-side benchmark (seis.benchmarks.versus) end to end on a tiny model: every system on the same prompts
at every batch size, paired ratios, greedy agreement with E0, and the JSON a figure in docs/ is made from."""
from __future__ import annotations

import json
import time

import pytest

from seis.benchmarks import versus
from seis.workloads.common import WorkloadDataError
from seis.workloads.gsm8k import resolve_gsm8k_dir


def _gsm8k_available() -> bool:
    try:
        resolve_gsm8k_dir()
        return True
    except WorkloadDataError:
        return False


def test_versus_times_every_system_on_the_same_prompts(tmp_path, monkeypatch):
    out = tmp_path / "v.json"
    gsm8k = _gsm8k_available()  # the GSM8K workload needs the source data (../shared or $SEIS_GSM8K_DIR)
    result = versus.main(["--model", "tiny-qwen3", "--batches", "1,3", "--new-tokens", "6", "--prompt-len", "12",
                          "--minisgl", "off", "--stack", "greedy-multistep-decode", "--device", "cpu",
                          "--json", str(out), *([] if gsm8k else ["--no-gsm8k"])])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["baseline"] == "E0" and result["weights"] == "random weights"  # no mini-sglang here: said so
    assert set(result["results"]) == {"random@1", "random@3"} | ({"gsm8k@1", "gsm8k@3"} if gsm8k else set())
    for key, systems in result["results"].items():
        assert set(systems) == {"E0", "E0 + greedy-multistep-decode"}
        e0 = systems["E0"]
        assert e0["vs_baseline"]["median"] == 1.0 and e0["tok_per_s"]["n"] == 3
        batch = int(key.split("@")[1])
        if key.startswith("random"):  # forced length: every request produced exactly the new tokens
            assert all(s["generated_tokens"] == 3 * batch * 6 for s in systems.values())
        # a lossless transformation: greedy tokens equal to E0's (fp32 on CPU)
        assert systems["E0 + greedy-multistep-decode"]["min_prefix_equal_to_e0"] >= 1
    assert "ratios against E0" in versus.render(result)
    from seis.engine_import import ENGINE_TEMPLATE
    from seis.workspace import tree_hash
    assert result["trees"]["E0"] == tree_hash(ENGINE_TEMPLATE)  # each row names the tree it measured
    assert set(result["trees"]) == {"E0", "E0 + greedy-multistep-decode"}
    assert f"E0 {tree_hash(ENGINE_TEMPLATE)[:12]}" in versus.render(result)


def test_versus_refuses_a_missing_minisgl_when_asked_for(monkeypatch):
    monkeypatch.setattr(versus.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="not importable"):
        versus.main(["--model", "tiny-qwen3", "--minisgl", "on"])


@pytest.mark.parametrize("args, message", [
    (["--batches", "1,eight"], "--batches wants batch sizes separated by commas"),
    (["--model", "no-such-model"], "--model: unknown model 'no-such-model'"),
    (["--call-timeout", "-1"], "--call-timeout a positive number"),
    (["--new-tokens", "0"], "--new-tokens need at least 1"),
    (["--prompt-len", "0"], "--prompt-len and --new-tokens need at least 1"),
])
def test_bad_arguments_end_in_one_line_before_any_engine_starts(args, message, monkeypatch):
    """A batch list that is no list of numbers, an unknown model or a negative call timeout ended in a traceback
    (ValueError, ModelError); a prompt or output length below 1 was found only by E0, whose "E0 failed" blamed the
    engine."""
    monkeypatch.setattr(versus, "engine_trees", lambda *a: pytest.fail("an engine tree was made"))
    with pytest.raises(SystemExit, match=message):
        versus.main(["--model", "tiny-qwen3", "--minisgl", "off", *args])


def test_several_stacks_each_under_its_label(tmp_path):
    stacks = versus.parse_stacks(["greedy-multistep-decode", "both=greedy-multistep-decode,overlapped-greedy-chunks"])
    assert stacks == [("E0 + greedy-multistep-decode", ["greedy-multistep-decode"]),
                      ("both", ["greedy-multistep-decode", "overlapped-greedy-chunks"])]
    assert versus.parse_stacks(["a,b"], "best stack") == [("best stack", ["a", "b"])]  # the older spelling
    trees = versus.engine_trees(stacks, {}, [], tmp_path / "store", tmp_path)
    assert list(trees) == ["E0", "E0 + greedy-multistep-decode", "both"]
    assert trees["both"] != trees["E0 + greedy-multistep-decode"]
    assert (trees["both"] / "engine" / "multistep.py").is_file()
    for bad, why in ((["a", "b"], "names a single"), (["x="], "wants")):
        with pytest.raises(SystemExit, match=why):
            versus.parse_stacks(bad, "L" if why == "names a single" else "")
    with pytest.raises(SystemExit, match="label taken"):
        versus.engine_trees([("E0", ["greedy-multistep-decode"])], {}, [], tmp_path / "store", tmp_path / "again")
    with pytest.raises(SystemExit, match="not in the library: nope"):
        versus.engine_trees([("x", ["nope"])], {}, [], tmp_path / "store", tmp_path / "third")


class _Recording:
    """A system that records what ends its requests and returns requests of fixed length."""

    def __init__(self, eos=None):
        if eos is not None:
            self.eos_token_ids = eos
        self.stops = []

    def generate(self, prompts, max_new_tokens, stop_ids):
        self.stops.append(stop_ids)
        return [[1] * max_new_tokens for _ in prompts]


def test_with_vanilla_in_the_run_every_system_stops_on_its_eos_ids():
    # A model's config may name more EOS ids than its tokenizer (Qwen3: two); mini-sglang stops on the tokenizer's
    # alone, so the engines must too, or the gsm8k rows compare requests of different lengths.
    vanilla, e0 = _Recording(eos=(258,)), _Recording()
    calls = {("random", 2): [[[5, 6], [7]]] * 4, ("gsm8k", 2): [[[5, 6], [7]]] * 4}
    versus.measure({versus.VANILLA: vanilla, "E0": e0}, calls, new_tokens=3, reps=3)
    assert vanilla.stops == e0.stops == [()] * 4 + [(258,)] * 4  # forced length, then vanilla's EOS for both
    alone = _Recording()
    versus.measure({"E0": alone}, calls, new_tokens=3, reps=3)
    assert alone.stops == [()] * 4 + [None] * 4  # without vanilla: the engine's own EOS ids


def test_minisgl_refuses_stop_ids_it_cannot_honour():
    m = versus.MiniSgl.__new__(versus.MiniSgl)
    m.eos_token_ids = (258,)
    with pytest.raises(ValueError, match="stops only on its tokenizer's EOS"):
        m.generate([[1]], 4, (256, 258))


def test_a_minisgl_that_stops_answering_ends_the_run_with_its_name():
    # A worker that says it is ready, then never answers: the call's time limit ends the run, naming the system.
    import sys
    silent = [sys.executable, "-c",
              "import json, sys; print(json.dumps({'ready': True, 'eos_token_ids': [2]}), flush=True); "
              "sys.stdin.readline(); sys.stdin.read()"]  # silent until its stdin closes
    m = versus.MiniSgl(None, call_timeout_s=1.0, command=silent)
    try:
        m.wait_built()
        assert m.eos_token_ids == (2,)
        with pytest.raises(SystemExit, match="vanilla mini-sglang failed on random at batch 1: .*within 1 s"):
            versus.measure({versus.VANILLA: m}, {("random", 1): [[[5]]] * 4}, new_tokens=2, reps=3)
    finally:
        m.close()
    assert m.proc.poll() is not None  # closed: not left running


def test_the_minisgl_worker_counts_a_final_eos_as_the_engines_do():
    from seis.benchmarks.minisgl_worker import with_eos
    assert with_eos([5, 6], 4, 2) == [5, 6, 2]  # stopped on EOS: mini-sglang left it out
    assert with_eos([5, 6, 7], 4, 2) == [5, 6, 7, 2]  # EOS ignored, but the last token was EOS: left out too
    assert with_eos([5, 6, 7, 8], 4, 2) == [5, 6, 7, 8]  # reached the limit on another token


def test_progress_names_each_systems_warm_up_time(capsys):
    # A run that hits its time limit during the first calls (kernels compiling) must say which system took it.
    class Slow(_Recording):
        def generate(self, prompts, max_new_tokens, stop_ids):
            if not self.stops:
                time.sleep(1.1)
            return super().generate(prompts, max_new_tokens, stop_ids)

    versus.measure({"E0": _Recording(), "slow": Slow()}, {("random", 1): [[[5]]] * 2}, new_tokens=2, reps=1)
    err = capsys.readouterr().err
    assert "random at batch 1: E0 warmed up in 0 s" in err and "random at batch 1: slow warmed up in 1 s" in err


# An engine whose build fails with a message of escape sequences: a clipboard write (OSC 52), a screen clear and a
# line rewritten into a forged result.
FORGED_FAILURE = '''
def _adv_build(self):
    raise RuntimeError("\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\rE0 x1.00  candidate x9.99 \\u202e")


Engine.build = _adv_build
'''


def _failing_engine(dest):
    import shutil

    from seis.engine_import import ENGINE_TEMPLATE
    shutil.copytree(ENGINE_TEMPLATE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    init = dest / "engine" / "__init__.py"
    init.write_text(init.read_text() + FORGED_FAILURE)
    return dest


@pytest.mark.parametrize("bench", ["versus", "ladder"])
def test_an_engines_failure_reaches_the_terminal_as_printable_text(bench, tmp_path):
    """versus and ladder take engine trees from elsewhere (--engine, --snapshot: a run's retained engine, an agent's):
    what its failure says ended the run raw, escape sequences and all, in a SystemExit or a traceback."""
    import subprocess
    import sys

    tree = _failing_engine(tmp_path / "bad")
    args = ["--model", "tiny-qwen3", "--engine", f"bad={tree}", "--new-tokens", "2", "--prompt-len", "4"]
    args += ["--batches", "1", "--minisgl", "off", "--no-gsm8k", "--device", "cpu"] if bench == "versus" else \
        ["--reps", "1"]
    done = subprocess.run([sys.executable, "-m", f"seis.benchmarks.{bench}", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode != 0
    assert "ZXZpbA==" in done.stderr and "\\x1b]52" in done.stderr  # said, as visible escapes
    assert not any(c in done.stderr for c in "\x1b\x07\r\u202e")


class _Replying:
    """An engine process stub whose generate reply is whatever the test gives."""

    engine_dir = "tree"

    def __init__(self, reply):
        self.reply = reply

    def generate(self, prompts, sampling, timeout_s=None):
        return self.reply


@pytest.mark.parametrize("reply", [
    [{"token_ids": [7] * 7, "finish_reason": "length"}],       # one id past --new-tokens (the client keeps it)
    [{"token_ids": "x" * 6, "finish_reason": "length"}],       # six characters counted as six tokens
    [{"token_ids": [1.5] * 6, "finish_reason": "length"}],
    [{"finish_reason": "stop"}],                                # a KeyError traceback
    ["ids"],                                                    # a TypeError traceback
    7,
])
def test_an_engines_reply_counts_only_as_tokens_it_could_have_produced(reply):
    """A SEIS engine (--engine, --snapshot) is counted only by replies that could be outputs: its tok/s was the length
    of whatever its reply held, so ids past --new-tokens on the gsm8k workload, or a string of the right length on
    the forced one, counted as tokens, and a reply that was no mapping with token ids ended in a traceback."""
    from seis.engine_host import EngineError
    engine = versus.SeisEngine.__new__(versus.SeisEngine)
    engine.proc, engine.call_timeout_s = _Replying(reply), 1.0
    for stop in (None, ()):
        with pytest.raises(EngineError, match="not .*token ids"):
            engine.generate([[5, 6]], 6, stop)
    engine.proc = _Replying([{"token_ids": [7] * 6, "finish_reason": "length"}])
    assert engine.generate([[5, 6]], 6, ()) == [[7] * 6]



def test_a_snapshot_from_a_store_that_is_not_there_or_lacks_it_exits_with_one_line(tmp_path):
    """--snapshot with a wrong --store made that folder a store and ended in UnknownSnapshotError's traceback."""
    store = tmp_path / "store"
    with pytest.raises(SystemExit, match="snapshot store not found at"):
        versus.engine_trees([], {}, ["0123456789abcdef"], store, tmp_path / "work")
    assert not store.exists()
    store.mkdir()
    with pytest.raises(SystemExit, match="--snapshot 0123456789abcdef: no snapshot"):
        versus.engine_trees([], {}, ["0123456789abcdef"], store, tmp_path / "work")


def test_every_system_of_a_run_has_a_label_of_its_own(tmp_path):
    """Labels name the rows of the table and the keys of the JSON: an --engine or --stack labelled "vanilla
    mini-sglang" took the baseline's place (every ratio then against that engine, mini-sglang's process left
    running), a second --engine with a label already given, or one named like a --snapshot's row, silently
    replaced the first, and a --snapshot given twice ended in "already exists and is not empty"."""
    from seis.benchmarks import labelled_dirs
    from seis.engine_import import ENGINE_TEMPLATE
    from seis.store import SnapshotStore
    from seis.workspace import copy_tree, tree_hash

    with pytest.raises(SystemExit, match="--engine same: given twice"):
        labelled_dirs(["same=/a", "same=/b"])
    assert labelled_dirs(["a=/x", "b=/x=y"]) == {"a": versus.Path("/x"), "b": versus.Path("/x=y")}
    store = tmp_path / "store"
    engine = tmp_path / "engine"
    copy_tree(ENGINE_TEMPLATE, engine)
    sid = SnapshotStore(store).put(engine)
    for i, (stacks, engines, snapshots) in enumerate([
            ([], {versus.VANILLA: ENGINE_TEMPLATE}, []),
            ([(versus.VANILLA, ["greedy-multistep-decode"])], {}, []),
            ([], {f"snapshot {sid}": ENGINE_TEMPLATE}, [sid]),
            ([], {}, [sid, sid])]):
        with pytest.raises(SystemExit, match="taken|given twice"):
            versus.engine_trees(stacks, engines, snapshots, store, tmp_path / f"work-{i}")
    trees = versus.engine_trees([], {"cand": engine}, [sid], store, tmp_path / "work")
    assert list(trees) == ["E0", "cand", f"snapshot {sid}"]
    # the --engine tree is measured from a copy taken now: a later edit of the directory changes nothing measured
    assert trees["cand"] != engine and tree_hash(trees["cand"]) == tree_hash(engine)
    (engine / "engine" / "model.py").write_text("raise SystemExit('edited during the run')\n")
    assert tree_hash(trees["cand"]) != tree_hash(engine)


def test_a_system_that_stops_elsewhere_than_the_baseline_is_shown_with_its_token_count():
    """At natural length tok/s is over whatever tokens a system returned: one that runs past the EOS the baseline
    stops on does more (cheaper, batched) decoding per second of the same work, and its cell now says so."""
    base = versus.Measured(tok_per_s=[100.0, 100.0, 100.0], tokens=[[[1] * 50, [1] * 50]] * 3)
    long = versus.Measured(tok_per_s=[150.0, 150.0, 150.0], tokens=[[[1] * 80, [1] * 80]] * 3)
    same = versus.Measured(tok_per_s=[110.0, 110.0, 110.0], tokens=[[[1] * 51, [1] * 50]] * 3)
    summary = versus.summary({("gsm8k", 2): {"E0": base, "runs on": long, "stops alike": same}}, "E0")
    cells = summary["gsm8k@2"]
    assert cells["runs on"]["tokens_vs_baseline"] == 1.6 and cells["stops alike"]["tokens_vs_baseline"] == 1.01
    result = {"device": "cpu", "model": "m", "weights": "random weights", "commit": "c", "reps": 3, "prompt_len": 8,
              "new_tokens": 80, "baseline": "E0", "systems": ["E0", "runs on", "stops alike"], "results": summary,
              "gsm8k_stop_ids": [2]}
    table = versus.render(result)
    line = {row.split("|")[1].strip(): row for row in table.splitlines() if row.startswith("|")}
    assert "(tokens +60 %)" in line["runs on"] and "tokens" not in line["stops alike"] and "tokens" not in line["E0"]
