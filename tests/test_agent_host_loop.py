"""A hostile model against the HOST side of the SDK agents' loop: what its tool calls make SEIS's own process do.
Each test crosses (or tries to cross) a bound of the orchestrator's process: CPU held in C code under the GIL
(which stops every other session's thread), work past the session's deadline, an exception that ends the session
instead of becoming a tool error the model reads. CPU only, a few seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]

# --- a search glob built to take quadratic time in the host's regex engine --------------------------------------

_GLOB_ATTACK = r"""
import json, sys, time
from pathlib import Path
from seis.agents.llm import tools
from seis.agents.llm.tools import Toolbox
root, glob = Path(sys.argv[1]), sys.argv[2]
tools.SEARCH_TIMEOUT_S = 1.0
box = Toolbox(root)
t0 = time.monotonic()
out = box.call("search", {"pattern": "needle", "glob": glob})
elapsed = time.monotonic() - t0
print(json.dumps({"is_error": out.is_error, "text": out.text[:300], "elapsed": elapsed}))
"""


def test_a_pathological_search_glob_cannot_hold_the_host_past_the_search_limit(tmp_path):
    """The search pattern runs in a child killed at its limit, but the glob ran in the host: fnmatch's regex for
    '*' followed by a long run of '[!b]' takes time quadratic in a path's length on each of up to 20,000 files, in
    re's C code (about 25 s of the orchestrator's CPU per call on 20,000 paths near the 1,024-byte bound, past
    every time limit, and a turn may make many calls). The glob must obey the same time limit as the pattern."""
    root = tmp_path / "workspace"
    deep = root.joinpath(*["a" * 250] * 3)
    deep.mkdir(parents=True)
    for i in range(4000):
        (deep / f"{'a' * 190}{i:05d}").write_text("needle\n")
    glob = "*" + "[!b]" * 900 + "b"
    done = subprocess.run([sys.executable, "-c", _GLOB_ATTACK, str(root), glob], capture_output=True, text=True,
                          timeout=120, cwd=PROJECT, env={**os.environ, "PYTHONPATH": str(PROJECT)})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["elapsed"] < 3.0, out        # the search's limit (1 s) plus the child's start, not the glob's time
    assert out["is_error"] and "longer than" in out["text"], out


def test_a_glob_still_selects_files_as_before(tmp_path):
    """As Path.rglob and fnmatch take it (fnmatch's * also crosses a /)."""
    from seis.agents.llm.tools import Toolbox
    root = tmp_path / "workspace"
    (root / "engine" / "sub").mkdir(parents=True)
    (root / "engine" / "model.py").write_text("needle = 1\n")
    (root / "engine" / "sub" / "kern.py").write_text("needle = 2\n")
    (root / "engine" / "notes.md").write_text("needle\n")
    box = Toolbox(root)
    for glob, expect in [("*.py", {"engine/model.py", "engine/sub/kern.py"}),
                         ("sub/*.py", {"engine/sub/kern.py"}), ("**/*.md", {"engine/notes.md"}),
                         ("engine/*.py", {"engine/model.py", "engine/sub/kern.py"}), ("*.rs", set())]:
        out = box.call("search", {"pattern": "needle", "glob": glob})
        found = {line.split(":", 1)[0] for line in out.text.splitlines() if ":" in line}
        assert found == expect, (glob, out.text)
