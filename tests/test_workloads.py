"""Workloads: deterministic GSM8K splits, answer extraction, retrieval items, shapes, prepare + manifest."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seis.workloads import (
    WorkloadDataError,
    WorkloadParams,
    extract_answer,
    gsm8k_messages,
    is_correct,
    load_dev_workloads,
    load_gsm8k_split,
    load_heldout_shapes,
    load_params,
    load_retrieval,
    prepare_all,
    resolve_gsm8k_dir,
    retrieval_messages,
    score_retrieval,
    verify_prepared,
)
from seis.workloads import _words
from seis.workloads.__main__ import main as cli_main
from seis.workloads.gsm8k import item_id, read_gsm8k_file, split_gsm8k
from seis.workloads.params import RetrievalParams
from seis.workloads.retrieval import build_retrieval_items, bucket_lengths
from seis.workloads.shapes import build_heldout_shapes

REPO_ROOT = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO_ROOT.parent / "shared" / "data" / "gsm8k"
PARAMS = WorkloadParams()

needs_gsm8k = pytest.mark.skipif(
    not GSM8K_DIR.is_dir(), reason=f"shared GSM8K data not found at {GSM8K_DIR} (expected ../shared from repo root)"
)


@pytest.fixture(scope="module")
def test_rows() -> list[tuple[str, str]]:
    if not GSM8K_DIR.is_dir():
        pytest.skip(f"shared GSM8K data not found at {GSM8K_DIR}")
    return read_gsm8k_file(GSM8K_DIR / "test.jsonl")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not GSM8K_DIR.is_dir():
        pytest.skip(f"shared GSM8K data not found at {GSM8K_DIR}")
    out = tmp_path_factory.mktemp("prepared")
    prepare_all(out, gsm8k_dir=GSM8K_DIR, params=PARAMS)
    return out


def test_params_yaml_matches_defaults() -> None:
    # The library defaults and the DVC-tracked params.yaml must describe the same workloads.
    assert load_params(REPO_ROOT / "params.yaml") == PARAMS


def test_dvc_yaml_lists_every_workloads_module() -> None:
    text = (REPO_ROOT / "dvc.yaml").read_text()
    modules = sorted(p.name for p in (REPO_ROOT / "seis" / "workloads").glob("*.py"))
    missing = [m for m in modules if f"seis/workloads/{m}" not in text]
    assert not missing, f"add to dvc.yaml deps: {missing}"
    assert "python -m seis.workloads prepare --out data/prepared" in text


# --- GSM8K -------------------------------------------------------------------------------------------------


@needs_gsm8k
def test_split_sizes_disjoint_deterministic(test_rows: list[tuple[str, str]]) -> None:
    assert len(test_rows) == 1319
    test, dev = split_gsm8k(test_rows, seed=0, test_size=660, dev_size=64)
    assert (len(test), len(dev)) == (660, 64)
    assert not {i.index for i in test} & {i.index for i in dev}
    assert not {i.id for i in test} & {i.id for i in dev}
    assert [i.index for i in test] == sorted(i.index for i in test)
    for item in test[:50] + dev:
        assert item.question == test_rows[item.index][0]
        assert item.answer == test_rows[item.index][1]
        assert item.id == item_id(item.question)
    again = split_gsm8k(test_rows, seed=0, test_size=660, dev_size=64)
    assert again == (test, dev)
    other_test, _ = split_gsm8k(test_rows, seed=1, test_size=660, dev_size=64)
    assert {i.index for i in other_test} != {i.index for i in test}
    # Dev size is configurable without moving the held-out split.
    test_b, dev_b = split_gsm8k(test_rows, seed=0, test_size=660, dev_size=100)
    assert test_b == test and len(dev_b) == 100 and set(dev) <= set(dev_b)


@needs_gsm8k
def test_prepared_splits_load(prepared: Path) -> None:
    test, dev = load_gsm8k_split("test", prepared), load_gsm8k_split("dev", prepared)
    assert (len(test), len(dev)) == (660, 256)
    assert all(i.split == "test" for i in test) and all(i.split == "dev" for i in dev)
    source = dict(enumerate(read_gsm8k_file(GSM8K_DIR / "test.jsonl")))
    assert all(source[i.index] == (i.question, i.answer) for i in test + dev)
    with pytest.raises(ValueError):
        load_gsm8k_split("train", prepared)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She makes $18 a day.\n#### 18", "18"),
        ("#### 1,000", "1000"),
        ("The total is 5 apples and then 7 more, so 12", "12"),
        ("So the answer is $1,234.", "1234"),
        ("It costs $18.00", "18"),
        ("18.0", "18"),
        ("He ran 2.50 miles", "2.5"),
        ("the answer is 0.75.", "0.75"),
        ("#### -7", "-7"),
        ("It dropped to -$5", "-5"),
        ("pages 3-5", "5"),
        ("#### 42 (I think 43 earlier)", "42"),
        ("first #### 10 then corrected #### 12", "12"),
        ("no number here", None),
        ("#### ", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_is_correct() -> None:
    assert is_correct("Step 1... #### 18.0", "18")
    assert is_correct("so she pays $1,200.", "#### 1200")
    assert is_correct("The answer is 2.5", "2.50")
    assert not is_correct("#### 17", "18")
    assert not is_correct("I don't know", "18")


def test_gsm8k_messages() -> None:
    msgs = gsm8k_messages("What is 2+2?")
    assert msgs[-1]["role"] == "user" and "What is 2+2?" in msgs[-1]["content"]
    assert "####" in msgs[-1]["content"] and "step by step" in msgs[-1]["content"]


def test_missing_gsm8k_dir_is_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(WorkloadDataError, match=re.escape(str(missing))):
        prepare_all(tmp_path / "out", gsm8k_dir=missing, params=PARAMS)
    monkeypatch.setenv("SEIS_GSM8K_DIR", str(missing))
    with pytest.raises(WorkloadDataError, match="SEIS_GSM8K_DIR"):
        resolve_gsm8k_dir()
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "test.jsonl").write_text("")
    with pytest.raises(WorkloadDataError, match="train.jsonl"):
        resolve_gsm8k_dir(partial)


def test_cli_reports_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["prepare", "--out", str(tmp_path / "out"), "--gsm8k-dir", str(tmp_path / "nope")])
    assert rc == 2
    assert "GSM8K directory not found" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["file", "file/sub"])
def test_cli_refuses_an_out_that_cannot_be_a_directory_in_one_line(tmp_path: Path, target: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--out naming a file (or a path under one) was a FileExistsError traceback; the file is left as it was."""
    (tmp_path / "file").write_text("kept\n")
    rc = cli_main(["prepare", "--out", str(tmp_path / target), "--gsm8k-dir", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"error: --out {tmp_path / target} ") and len(err.splitlines()) == 1, err
    assert (tmp_path / "file").read_text() == "kept\n"


def test_malformed_gsm8k_file_names_line(tmp_path: Path) -> None:
    good = json.dumps({"question": "q?", "answer": "so\n#### 3"})
    bad_cases = {
        "{not json": "not valid JSON",
        json.dumps({"question": "q?"}): "string",
        json.dumps({"question": "q?", "answer": "no marker 3"}): "####",
        json.dumps({"question": "q?", "answer": "#### none"}): "no number",
        "": "empty line",
    }
    for bad, why in bad_cases.items():
        path = tmp_path / "test.jsonl"
        path.write_text(f"{good}\n{bad}\n{good}\n")
        with pytest.raises(WorkloadDataError, match=re.escape(f"{path}:2") + ".*" + why):
            read_gsm8k_file(path)


# --- retrieval ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def retrieval_items():
    return build_retrieval_items(PARAMS.retrieval, PARAMS.seed)


def test_retrieval_layout(retrieval_items) -> None:
    rp = PARAMS.retrieval
    lengths = bucket_lengths(rp)
    assert len(lengths) == 9 and lengths[0] == 256 and lengths[-1] == rp.max_tokens
    assert lengths == sorted(set(lengths))
    assert len(retrieval_items) == 270
    assert [it.index for it in retrieval_items] == list(range(270))
    assert len({it.id for it in retrieval_items}) == 270
    for b, target in enumerate(lengths):
        bucket = [it for it in retrieval_items if it.bucket == b]
        assert len(bucket) == 30 and all(it.target_tokens == target for it in bucket)
        for depth in rp.depths:
            assert sum(it.depth == depth for it in bucket) == 30 // len(rp.depths)
        # Close to the target and never over it (so the largest bucket fits the model's context).
        assert all(0.9 * target * rp.chars_per_token <= it.n_chars <= target * rp.chars_per_token for it in bucket)
    assert len({it.key for it in retrieval_items}) == 270
    assert len({it.value for it in retrieval_items}) == 270


def test_retrieval_needle_once(retrieval_items) -> None:
    for it in retrieval_items:
        ctx = it.context
        assert len(ctx) == it.n_chars
        assert ctx.count(it.needle) == 1 and ctx.count(it.key) == 1 and ctx.count(it.value) == 1
        assert ctx[it.needle_offset:].startswith(it.needle)
        assert re.findall(r"\d+", ctx) == [it.value] and re.fullmatch(r"[1-9]\d{5}", it.value)
        assert "pass code" not in ctx.replace(it.needle, "")
        assert it.key in it.question and it.value not in it.question
        # Depth as designed: the needle's relative position is within a sentence of the target depth.
        slack = (len(it.needle) + 100) / it.n_chars  # needle length + about one filler sentence
        assert abs(it.needle_offset / it.n_chars - it.depth) < slack
    starts = [it for it in retrieval_items if it.depth == 0.0]
    ends = [it for it in retrieval_items if it.depth == 1.0]
    assert all(it.needle_offset == 0 for it in starts)
    assert all(it.context.endswith(it.needle) for it in ends)


def test_retrieval_deterministic(retrieval_items) -> None:
    assert build_retrieval_items(PARAMS.retrieval, PARAMS.seed) == retrieval_items
    other = build_retrieval_items(PARAMS.retrieval, PARAMS.seed + 1)
    assert [it.value for it in other] != [it.value for it in retrieval_items]
    small = build_retrieval_items(RetrievalParams(max_tokens=1024, n_buckets=3, items_per_bucket=5), 0)
    assert len(small) == 15 and max(it.target_tokens for it in small) == 1024


def test_word_lists_keep_keys_unique() -> None:
    filler = (_words.FILLER_NOUNS + _words.FILLER_ADJECTIVES + _words.FILLER_VERBS + _words.FILLER_PREPOSITIONS
              + _words.FILLER_TIMES + _words.FILLER_ADVERBS)
    filler_text = " ".join(filler).lower()
    for word in _words.KEY_ADJECTIVES + _words.KEY_NOUNS:
        assert word not in filler_text, word
    assert not re.search(r"\d", filler_text)


def test_score_retrieval(retrieval_items) -> None:
    it = retrieval_items[0]
    v = it.value
    assert score_retrieval(v, it)
    assert score_retrieval(f"The pass code for the {it.key} is {v}.", it)
    assert score_retrieval(f"{v[:3]},{v[3:]}", it)
    assert not score_retrieval(v[:5], it)
    assert not score_retrieval(v + "7", it)
    assert not score_retrieval("I could not find it.", it)
    assert score_retrieval("code 123456", "123456")
    msgs = retrieval_messages(it)
    assert it.context in msgs[-1]["content"] and msgs[-1]["content"].endswith(it.question)


# --- speed workloads ---------------------------------------------------------------------------------------


def test_heldout_shapes_differ_from_dev() -> None:
    shapes = build_heldout_shapes(PARAMS.heldout, PARAMS.seed)
    pairs = [(s.prompt_len, s.output_len) for s in shapes.shapes]
    assert pairs == [(p, o) for p in (32, 512, 1500) for o in (64, 512)]
    assert all(o != PARAMS.dev.max_new_tokens for _, o in pairs)
    for s in shapes.shapes:
        assert len(s.token_ids) == s.prompt_len
        assert all(1000 <= t < 30000 for t in s.token_ids)
    heads = [s.token_ids[:16] for s in shapes.shapes]
    assert len(set(heads)) == len(heads)  # no shared prefixes between shapes (no free prefix-cache hits)
    assert build_heldout_shapes(PARAMS.heldout, PARAMS.seed).digest() == shapes.digest()
    with pytest.raises(ValueError):
        WorkloadParams.model_validate({"heldout": {"output_lens": [64, 256]}})


# --- prepare -----------------------------------------------------------------------------------------------


@needs_gsm8k
def test_prepare_is_byte_identical(prepared: Path, tmp_path: Path) -> None:
    again = prepare_all(tmp_path, gsm8k_dir=GSM8K_DIR, params=PARAMS)
    first = verify_prepared(prepared)
    assert again == first and again.digest() == first.digest()
    for name in list(first.outputs) + ["manifest.json"]:
        assert (prepared / name).read_bytes() == (tmp_path / name).read_bytes(), name
    assert {n: r.count for n, r in first.outputs.items()} == {
        "gsm8k_test.jsonl": 660, "gsm8k_dev.jsonl": 256, "retrieval.jsonl": 270,
        "heldout_shapes.json": 6, "dev_workloads.json": 2,
    }
    assert first.seed == 0 and first.sources["gsm8k/test.jsonl"].count == 1319
    assert set(first.workload_digests) == {"dev-natural", "dev-fixed256", "heldout_shapes"}


@needs_gsm8k
def test_prepared_files_load_and_verify(prepared: Path, retrieval_items) -> None:
    assert load_retrieval(prepared) == retrieval_items
    dev = load_gsm8k_split("dev", prepared)
    natural, fixed = load_dev_workloads(prepared)
    assert natural.item_ids == fixed.item_ids == tuple(i.id for i in dev)
    assert (natural.ignore_eos, natural.max_new_tokens, natural.batch_size) == (False, 256, 1)
    assert (fixed.ignore_eos, fixed.max_new_tokens, fixed.min_new_tokens) == (True, 256, 256)
    assert natural.include_prefill
    assert load_heldout_shapes(prepared) == build_heldout_shapes(PARAMS.heldout, PARAMS.seed)


@needs_gsm8k
def test_verify_detects_tampering(tmp_path: Path) -> None:
    prepare_all(tmp_path, gsm8k_dir=GSM8K_DIR, params=PARAMS)
    with (tmp_path / "gsm8k_dev.jsonl").open("a") as f:
        f.write("\n")
    with pytest.raises(WorkloadDataError, match="gsm8k_dev.jsonl"):
        verify_prepared(tmp_path)
