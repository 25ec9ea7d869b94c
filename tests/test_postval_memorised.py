"""Accuracy outputs the model did not produce: the GSM8K test questions and the retrieval items are public, and the
accuracy prompts are the questions as they are, so a candidate can recognise them and answer from a table shipped in
its tree (or pull a retrieval value out of the prompt with a regex) while its model is wrong or never ran. Such an
answer is charged: vanilla scores the candidate's own output teacher-forced, and a correct answer it would not have
produced (up to the gate's near-tie margin) is counted wrong and flagged."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seis.engine_import import ENGINE_TEMPLATE
from seis.postval import make_config, run_post_validation
from seis.postval.accuracy import Output, unbacked_answers
from seis.postval.plan import prepare_plan

# The tree ships answers.json: prompt token ids -> the answer's token ids (what a hostile author builds offline
# with the model's tokenizer from the public GSM8K test split and retrieval file). MODE "whole" replies with the
# answer alone; "tail" lets the model reason as usual and splices the answer over the end of its output, so that
# nearly every token is still the model's own.
MEMORISED = """
import json as _adv_json
import os as _adv_os

with open(_adv_os.path.join(_adv_os.path.dirname(__file__), "answers.json")) as _f:
    _adv_spec = _adv_json.load(_f)
_adv_answers = {tuple(map(int, k.split(","))): v for k, v in _adv_spec["answers"].items()}
_adv_generate_m = Engine.generate


def _adv_memorised(self, prompts, sampling=None):
    outs = _adv_generate_m(self, prompts, sampling)
    res = []
    for p, g in zip(prompts, outs):
        ans = _adv_answers.get(tuple(p))
        if ans is None:
            res.append(g)
        elif _adv_spec["mode"] == "whole":
            res.append(type(g)(list(ans), "stop"))
        else:
            keep = max(0, len(g.token_ids) - len(ans))
            res.append(type(g)(list(g.token_ids[:keep]) + list(ans), g.finish_reason))
    return res


Engine.generate = _adv_memorised
"""

# tiny-qwen3 serves 512 tokens, shorter than every retrieval prompt: retrieval answers go through the same
# accuracy path (run._accuracy_task) and are judged by the same rule
RUN = dict(model="tiny-qwen3", device="cpu", cpu_threads=1, gsm8k_items=2, retrieval_items=0, speed_requests=0,
           fixed_single_requests=0, dev_requests=0, heldout=False, max_batch_size=4, figures=False,
           bandwidth_gbs=10.0, prompt_nonce="5eed")


def _memorising(dest: Path, prepared_dir: Path, mode: str, **run) -> Path:
    shutil.copytree(ENGINE_TEMPLATE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    plan = prepare_plan(make_config(engine_dir=dest, out_dir=dest.parent / "unused", prepared_dir=prepared_dir,
                                    **run))
    tok = plan.tokenizer
    answers = {}
    for it, p in zip(plan.gsm8k_items, plan.gsm8k_prompts, strict=True):
        answers[",".join(map(str, p))] = tok.encode(f"#### {it.answer}", add_special_tokens=False)
    for it, p in zip(plan.retrieval_items, plan.retrieval_prompts, strict=True):
        answers[",".join(map(str, p))] = tok.encode(it.value, add_special_tokens=False)
    (dest / "engine" / "answers.json").write_text(json.dumps({"mode": mode, "answers": answers}))
    init = dest / "engine" / "__init__.py"
    init.write_text(init.read_text() + MEMORISED)
    return dest


@pytest.mark.parametrize("mode", ["whole", "tail"])
def test_memorised_answers_are_counted_wrong_and_flagged(tmp_path, prepared_dir, mode):
    cand = _memorising(tmp_path / "memo", prepared_dir, mode, **RUN)
    r = run_post_validation(make_config(engine_dir=cand, out_dir=tmp_path / "out", prepared_dir=prepared_dir, **RUN))
    assert [a.task for a in r.accuracy] == ["gsm8k"]
    shown = [o for o in r.items if o.engine == "candidate"]
    for a in r.accuracy:
        # the memorised answer is what it replied (so the extractor found the gold number) ...
        assert all(o.text.strip().endswith(o.gold) for o in r.items if o.engine == "candidate" and o.task == a.task)
        # ... and it is charged as what the model did: not an answer of the model's, not correct
        assert a.unbacked == a.items, a
        assert a.candidate_acc == 0.0, a
        assert any(f.startswith(f"{a.task}:") and "would not have produced" in f for f in r.flags), r.flags
    assert all(not o.backed and not o.correct for o in r.items if o.engine == "candidate"), shown
    assert all(o.backed for o in r.items if o.engine == "vanilla")
    out = Path(r.config.out_dir)
    assert "would not have produced" in (out / "accuracy.md").read_text()


def test_an_honest_copy_has_every_answer_backed(tmp_path, prepared_dir):
    """E0's copy answers as vanilla does: nothing charged, nothing flagged."""
    cand = tmp_path / "copy"
    shutil.copytree(ENGINE_TEMPLATE, cand, ignore=shutil.ignore_patterns("__pycache__"))
    r = run_post_validation(make_config(engine_dir=cand, out_dir=tmp_path / "out", prepared_dir=prepared_dir, **RUN))
    assert all(a.unbacked == 0 for a in r.accuracy) and not r.flags
    assert all(o.backed for o in r.items)


class _Score:
    def __init__(self, valid: list[bool]):  # vanilla's top-1 is 0.0; a valid token lies within the margin of it
        self.token_logprobs = [-0.1 if v else -2.0 for v in valid]
        self.top_logprobs = [[0.0] for _ in valid]


class _Scorer:
    def __init__(self, valid: list[list[bool]]):
        self.valid, self.asked = valid, []

    def score(self, prompts, continuations, top_k):
        self.asked += continuations
        return [_Score(self.valid[len(self.asked) - len(continuations) + i]) for i in range(len(continuations))]


def _out(n: int, first: int = 1) -> Output:
    return Output(list(range(first, first + n)), "length", "")


def test_an_answer_spliced_over_the_models_own_output_is_unbacked_where_bf16_rounding_is_not():
    """200 tokens: three of them off vanilla's pick in the middle (a bf16 engine's near-ties, within the 0.97 a row is
    allowed) stay backed; the same three at the end, where the answer is, do not: an engine that lets its model
    reason and splices a memorised number over the end keeps 98.5 % of the tokens vanilla's own. Outputs identical to
    vanilla's and wrong answers are not scored at all; an over-long output is never backed."""
    middle = [not 90 <= k < 93 for k in range(200)]
    end = [k < 197 for k in range(200)]
    scorer = _Scorer([middle, end])
    cand = [_out(200), _out(200), _out(200, 7), _out(200, 9), _out(17)]
    van = [_out(200, 2), _out(200, 3), _out(200, 7), _out(200, 4), _out(17)]
    correct = [True, True, True, False, True]
    got = unbacked_answers(scorer, [[1]] * 5, cand, van, correct, margin=0.3, min_valid=0.97, max_new=16 * 16,
                           context=512, eos_ids=[0])
    assert got == [False, True, False, False, False] and len(scorer.asked) == 2
    assert unbacked_answers(_Scorer([]), [[1]], [_out(257)], [_out(3)], [True], 0.3, 0.97, 256, 4096, [0]) == [True]
    # a 3-token memorised reply: nothing of it is vanilla's
    assert unbacked_answers(_Scorer([[False] * 3]), [[1]], [_out(3)], [_out(3, 5)], [True], 0.3, 0.97, 256, 4096,
                            [0]) == [True]
