"""Deliberately broken candidates for the evaluator tests: copies of engine_template with one small edit each.

Every edit asserts that the text it replaces exists exactly once, so a change to the template breaks the helper
loudly instead of silently producing a candidate that is not broken.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from seis.engine_import import ENGINE_TEMPLATE
from seis.evaluator import CheckSizes, GateConfig, IsolationConfig, SpeedConfig

ENGINE_PY = "engine/engine.py"
MODEL_PY = "engine/model.py"

# Where these gates run: CPU in CI; SEIS_TEST_DEVICE=cuda runs the same suites (the adversarial one included) on a GPU.
TEST_DEVICE = os.environ.get("SEIS_TEST_DEVICE", "cpu")
if TEST_DEVICE not in ("cpu", "cuda"):
    raise ValueError(f"SEIS_TEST_DEVICE={TEST_DEVICE!r}: cpu or cuda")

# Small enough for CPU (two cores) yet covering every check: dev, held-out GSM8K and shapes, EOS probes.
TINY_CHECKS = CheckSizes(n_dev=3, n_heldout_gsm8k=2, n_heldout_shapes=2, max_new_tokens=12, tf_max_tokens=12,
                         n_eos_probes=2, probe_new_tokens=3)


# The tests' gates ask the same prompts every run: on tiny-qwen3's random weights how clearly a check separates a
# broken engine varies with the prompt (late.decode.kl of a RoPE clamped at 256: 0.02-0.24 over request tags). A
# gate's own nonce is random; its secrecy has tests of its own (test_gate_contract, the adversarial candidates).
TEST_NONCE = "5eed0123"


def tiny_config(prepared: Path, candidate: Path, **overrides) -> GateConfig:
    values = dict(candidate=candidate, model="tiny-qwen3", device=TEST_DEVICE, prepared_dir=prepared,
                  prompt_nonce=TEST_NONCE,
                  max_prompt_tokens=96, max_batch_size=16, checks=TINY_CHECKS, speed=SpeedConfig(enabled=False),
                  isolation=IsolationConfig(build_timeout_s=60, call_timeout_s=60, gate_timeout_s=300))
    values.update(overrides)
    return GateConfig(**values)


def copy_engine(dest: Path) -> Path:
    shutil.copytree(ENGINE_TEMPLATE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def after_each_reply(root: Path, then: str) -> Path:
    """The engine tree at root runs `then` (Python, with `out` and `payload` in scope) right after each reply the
    worker sends: a candidate that misbehaves between its replies and the next request."""
    body = "\n".join("        " + line for line in then.strip().splitlines())
    init = root / "engine" / "__init__.py"
    init.write_text(init.read_text() + (
        "\nimport __main__ as _main\n"
        "if hasattr(_main, '_reply'):\n"
        "    _sent = _main._reply\n"
        "    def _reply_and_then(out, **payload):\n"
        "        _sent(out, **payload)\n"
        f"{body}\n"
        "    _main._reply = _reply_and_then\n"))
    return root


def edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert text.count(old) == 1, f"{rel}: expected exactly one {old!r}"
    path.write_text(text.replace(old, new))


# --- numerics -----------------------------------------------------------------------------------------------------
def skip_last_layer(root: Path) -> Path:
    edit(root, MODEL_PY, "        for layer in self.layers:\n", "        for layer in self.layers[:-1]:\n")
    return root


def perturb_logits(root: Path, std: float = 1.0) -> Path:
    edit(root, MODEL_PY, "        return F.linear(hidden.index_select(0, batch.logit_rows), self.lm_head).float()",
         "        logits = F.linear(hidden.index_select(0, batch.logit_rows), self.lm_head).float()\n"
         f"        return logits + {std} * torch.randn_like(logits)")
    return root


# --- request handling ---------------------------------------------------------------------------------------------
GENERATE_RETURN = "        return [Generation(list(r.output), r.finish_reason) for r in reqs]"


def drop_requests(root: Path) -> Path:
    edit(root, ENGINE_PY, GENERATE_RETURN,
         "        return [Generation(list(r.output), r.finish_reason) for r in reqs][: max(1, len(reqs) - 1)]")
    return root


def truncate_outputs(root: Path) -> Path:
    edit(root, ENGINE_PY, GENERATE_RETURN,
         "        return [Generation(list(r.output)[: max(1, len(r.output) // 2)], r.finish_reason) for r in reqs]")
    return root


def ignore_eos(root: Path) -> Path:
    edit(root, ENGINE_PY,
         "        stop = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else "
         "frozenset(self.eos_token_ids))",
         "        stop = frozenset(params.stop_token_ids)")
    return root


# --- failures to start or answer ----------------------------------------------------------------------------------
def import_error(root: Path) -> Path:
    path = root / "engine" / "__init__.py"
    path.write_text("import engine_dependency_that_does_not_exist  # noqa: F401\n" + path.read_text())
    return root


def build_error(root: Path) -> Path:
    edit(root, ENGINE_PY, "        opts, cfg = self.options, self.config\n",
         "        raise RuntimeError('weights in an unexpected layout')\n")
    return root


def hang_in_build(root: Path) -> Path:
    edit(root, ENGINE_PY, "        opts, cfg = self.options, self.config\n",
         "        time.sleep(3600)\n        opts, cfg = self.options, self.config\n")
    return root


# --- cheating -----------------------------------------------------------------------------------------------------
def hardcode_outputs(root: Path, baked: dict[tuple[int, ...], tuple[list[int], str]]) -> Path:
    """Return baked reference outputs for the dev prompts and junk for every other prompt: right on dev only."""
    (root / "engine" / "_baked.json").write_text(json.dumps({json.dumps(list(p)): v for p, v in baked.items()}))
    edit(root, ENGINE_PY,
         "        params = self._per_request(sampling or SamplingParams(), len(prompts))\n"
         "        reqs = [self._new_request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]\n"
         "        self._run(reqs)\n" + GENERATE_RETURN + "\n",
         "        params = self._per_request(sampling or SamplingParams(), len(prompts))\n"
         "        import json as _json\n"
         "        baked = _json.loads((Path(__file__).parent / '_baked.json').read_text())\n"
         "        out = []\n"
         "        for p, sp in zip(prompts, params):\n"
         "            hit = baked.get(_json.dumps(list(p)))\n"
         "            out.append(Generation(list(hit[0]), hit[1]) if hit else Generation([p[-1]] * sp.max_new_tokens,"
         " 'length'))\n"
         "        return out\n")
    return root


def dev_only_batches(root: Path, dev_prompts: list[tuple[int, ...]]) -> Path:
    """Exact when every prompt of a call is a known dev prompt; noisy logits otherwise (e.g. a faster, sloppier
    path taken only when it cannot be caught on the dev benchmark)."""
    (root / "engine" / "_dev.json").write_text(json.dumps([list(p) for p in dev_prompts]))
    flag = "        self._noisy = not all(list(p) in self._dev for p in {})\n"
    edit(root, ENGINE_PY, "        params = self._per_request(sampling or SamplingParams(), len(prompts))\n",
         flag.format("prompts") + "        params = self._per_request(sampling or SamplingParams(), len(prompts))\n")
    edit(root, ENGINE_PY, "        self._check_pairs(prompts, continuations)\n",
         flag.format("prompts") + "        self._check_pairs(prompts, continuations)\n")
    edit(root, ENGINE_PY, "        self._check_pairs(prefixes, drafts)\n",
         flag.format("prefixes") + "        self._check_pairs(prefixes, drafts)\n")
    edit(root, ENGINE_PY, "        return self.model.forward(batch, self.attn, self.kv)\n",
         "        logits = self.model.forward(batch, self.attn, self.kv)\n"
         "        return logits + 5.0 * torch.randn_like(logits) if getattr(self, '_noisy', False) else logits\n")
    edit(root, ENGINE_PY, "        self._build_seconds = 0.0\n",
         "        self._build_seconds = 0.0\n"
         "        import json as _json\n"
         "        self._dev = _json.loads((Path(__file__).parent / '_dev.json').read_text())\n")
    return root


# --- an honest engine that reports the conditions it runs under ---------------------------------------------------
def introspecting(root: Path, secrets: tuple[Path, ...] = ()) -> Path:
    """The engine's stats report what its process sees, including which of `secrets` it can read."""
    edit(root, ENGINE_PY, '            **self._counters,\n        }',
         '            **self._counters,\n'
         f'            "probe_secrets_visible": [p for p in {[str(p) for p in secrets]!r} '
         'if __import__("os").path.exists(p)],\n'
         '            "probe_rlimit_as": __import__("resource").getrlimit(__import__("resource").RLIMIT_AS)[0],\n'
         '            "probe_oom_score_adj": open("/proc/self/oom_score_adj").read().strip(),\n'
         '            "probe_env": sorted(__import__("os").environ),\n'
         '            "probe_interfaces": sorted(l.split(":")[0].strip() for l in '
         'open("/proc/net/dev").read().splitlines()[2:]),\n'
         '            "probe_engine_file": __file__,\n'
         '        }')
    return root
