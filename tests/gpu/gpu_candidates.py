"""What the GPU checks of library entries share: the candidate (E0 + one entry, after its prerequisites), a kernel
module loaded from it, and fp32 tiny-qwen3 on CUDA with graphs for E0 and the candidate on the same prompts, so an
entry can be required to keep E0's greedy tokens exactly."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from seis.engine_import import ENGINE_TEMPLATE
from seis.models import resolve_model

PROMPTS = [[5, 17, 33, 100, 7], [9] * 40, list(range(3, 300)), [200]]
OPTIONS = {"device": "cuda", "dtype": "float32", "max_batch_size": 4, "max_seq_len": 512}


def library_candidate(name: str, dest: Path) -> Path:
    """E0 with the library entry `name` (after its prerequisites, if it has any)."""
    from seis.agents.offline.library import load_library
    from seis.agents.offline.merge import with_prerequisites
    from seis.agents.offline.verify import build_candidate
    t = next(t for t in load_library() if t.name == name)
    return build_candidate(dest, with_prerequisites(t))


def load_module(candidate: Path, rel: str, name: str):
    """A kernel file of the candidate as a module of its own (beside E0's, without importing its engine)."""
    spec = importlib.util.spec_from_file_location(name, candidate / rel)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # triton's jit reads the kernel's source through the module
    spec.loader.exec_module(module)
    return module


def e0_and_candidate(candidate: Path, run, options: dict | None = None) -> tuple:
    """(run(E0's engine), run(the candidate's engine)), each built in its own process (OPTIONS, or `options`)."""
    from seis.engine_host import EngineProcess
    results = []
    for engine_dir in (ENGINE_TEMPLATE, candidate):
        with EngineProcess(engine_dir, resolve_model("tiny-qwen3"), options or OPTIONS, timeout_s=600) as eng:
            eng.build()
            results.append(run(eng))
    return tuple(results)
