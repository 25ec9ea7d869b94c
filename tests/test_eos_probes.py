"""EOS probes on a real instruct model: SmolLM2-135M-Instruct answers none of the gate's GSM8K prompts within the
smoke or quick output budget, and no single-token prompt of it is followed by an EOS, so the gate's EOS probes
come from its chat probe questions (evaluator/workloads.py CHAT_PROBE_QUESTIONS, through the model's own chat
template). An engine that never stops at an EOS must fail there at every gate size, while E0 passes; a model
without a chat template skips that source and keeps the other two."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from seis.evaluator import GateResult, SpeedConfig, run_gate
from seis.evaluator.correctness import Runs, _mine_probes
from seis.evaluator.engines import GenerationOut
from seis.evaluator.workloads import CHAT_PROBE_QUESTIONS, PromptSet, load_gate_workloads
from seis.models import resolve_model
from seis.run_config import RunConfig
from seis.session.steps import gate_config

import evaluator_helpers as H

EOS_CHECKS = ("eos_probe.stops", "eos_probe.eos")


def every_request_ignore_eos(root: Path) -> Path:
    """Treats every request as ignore_eos (the other way to never stop at an EOS)."""
    H.edit(root, H.ENGINE_PY, "frozenset() if params.ignore_eos else frozenset(self.eos_token_ids)",
           "frozenset() if True else frozenset(self.eos_token_ids)")
    return root


# What a gate runs besides the EOS probes' sources and budgets (sampling semantics, stop ids, long contexts, late
# positions, the held-out splits) has no bearing on which probes are mined here and takes most of its time on this
# CPU (the quick gate: 11 minutes in all, about 1 without). The dev outputs, the chat questions, the prompt cap and
# the probe budgets stay the gate size's. Held-out prompts could only add probes through outputs that end in an EOS,
# like the dev prompts' (which never do here: the probes come from the chat questions); without them the reference
# runs 4 prompts instead of 10 at the quick size, each alone and batched, generated and teacher-forced.
WITHOUT_UNRELATED = {"n_sampling_prompts": 0, "n_stop": 0, "n_long": 0, "late_tokens": 0, "n_heldout_gsm8k": 0,
                     "n_heldout_shapes": 0}


def smollm2_gate(size: str, prepared: Path, candidate: Path, trim: dict | None = None) -> GateResult:
    """The gate a session of that size runs (steps.gate_config), on CPU, without the speed part (not the point
    here, and it runs only on a pass) and without a snapshot store (the live engine_template is the reference);
    `trim` overrides check sizes."""
    config = gate_config(RunConfig(model="smollm2-135m-instruct", device="cpu", gate=size), candidate=candidate,
                         prepared_dir=prepared)
    update = {"store": None, "speed": SpeedConfig(enabled=False)}
    if trim:
        update["checks"] = config.checks.model_copy(update=trim)
    return run_gate(config.model_copy(update=update))


def _by_name(result: GateResult) -> dict:
    return {c.name: c for c in result.checks}


# Each size: E0 and one EOS-ignoring engine (the two ways to ignore EOS look the same to a probe, which asks for
# EOS on: one way per size).
@pytest.mark.slow
@pytest.mark.parametrize("size, make, trim", [
    ("smoke", None, WITHOUT_UNRELATED),
    ("smoke", H.ignore_eos, WITHOUT_UNRELATED),
    ("quick", every_request_ignore_eos, WITHOUT_UNRELATED),  # E0 on the same probes: the smoke-e0 case
], ids=["smoke-e0", "smoke-never_stops_at_eos", "quick-every_request_ignore_eos"])
def test_smollm2_eos_probes_catch_an_engine_that_ignores_eos(size: str, make, trim, prepared_dir: Path,
                                                             tmp_path: Path) -> None:
    candidate = H.copy_engine(tmp_path / "candidate")
    if make is not None:
        make(candidate)
    result = smollm2_gate(size, prepared_dir, candidate, trim)
    checks = _by_name(result)
    assert result.counts["eos_probes"] >= 1
    assert not any(checks[n].skipped for n in EOS_CHECKS), [checks[n].detail for n in EOS_CHECKS]
    if make is None:
        assert result.verdict == "pass", result.failed_checks
    else:
        assert result.verdict == "fail"
        assert set(EOS_CHECKS) <= set(result.failed_checks), result.failed_checks


def test_chat_probes_skip_a_model_without_a_chat_template(prepared_dir: Path, tmp_path: Path) -> None:
    """tiny-qwen3 with its chat template removed: no chat probes (with the reason), and the probes come from the
    other sources exactly as before (no chat call made)."""
    model = tmp_path / "tiny-no-template"
    shutil.copytree(resolve_model("tiny-qwen3"), model)
    (model / "chat_template.jinja").unlink()
    config = H.tiny_config(prepared_dir, tmp_path / "candidate", model=str(model))
    wl = load_gate_workloads(config, model)
    assert len(wl.chat_probes) == 0 and "no chat template" in wl.chat_probe_note
    assert len(wl.dev) == config.checks.n_dev  # the rest of the workload is built as before (plain-text prompts)

    with_template = load_gate_workloads(H.tiny_config(prepared_dir, tmp_path / "candidate"),
                                        resolve_model("tiny-qwen3"))
    assert 0 < len(with_template.chat_probes) <= len(CHAT_PROBE_QUESTIONS) and not with_template.chat_probe_note

    class ScanOnly:  # answers the single-token scan: token 7 is followed by an EOS
        calls: list[int] = []

        def generate(self, prompts, sampling):
            self.calls.append(len(prompts))
            return [GenerationOut(token_ids=[258 if p == [7] else 5], finish_reason="length") for p in prompts]

    ref = ScanOnly()
    no_eos = Runs(gen={"dev": [GenerationOut(token_ids=[5, 6], finish_reason="length")]})
    dev = PromptSet("dev", ("d",), ((1, 2, 3),), wl.dev.sampling[:1])
    probes = _mine_probes(ref, {"dev": dev}, no_eos, {258, 256}, 2, 300, wl.chat_probes, 3)
    assert probes == [[7]] and ref.calls == [300 - 2]  # one call: the single-token scan (EOS ids left out)
