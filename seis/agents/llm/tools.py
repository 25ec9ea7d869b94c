"""One provider-neutral tool layer for SDK agents: specs (JSON schemas, rendered per API) and a Toolbox that
executes calls inside the workspace. A wrong call is a ToolOutcome with is_error=True, never an exception."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...workspace.tree import IGNORED_DIRS, IGNORED_SUFFIXES
from .paths import ToolError, confine, rel
from .shell import NO_SANDBOX, Sandbox, run_shell, truncate

DevBenchmark = Callable[[Path], str]  # workspace root -> the rendered dev table (render_dev_benchmark text)
MAX_READ_CHARS = 60_000
MAX_LIST = 500
MAX_MATCHES = 200


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments (an object)

    def anthropic(self) -> dict:
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}

    def openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def _obj(required: list[str], **props: dict) -> dict:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


_S = {"type": "string"}
_I = {"type": "integer"}
TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec("list_files", "List files under a directory of the workspace (relative path, default '.').",
             _obj([], path={**_S, "description": "directory relative to the workspace root"})),
    ToolSpec("read_file", "Read a text file of the workspace, optionally a line range (1-based, inclusive).",
             _obj(["path"], path=_S, start_line=_I, end_line=_I)),
    ToolSpec("search", "Regex search (Python syntax) over the workspace's text files; returns path:line: text.",
             _obj(["pattern"], pattern=_S, path={**_S, "description": "directory or file, default '.'"},
                  glob={**_S, "description": "file-name glob, e.g. '*.py'"})),
    ToolSpec("edit_file", "Replace one exact occurrence of old_string with new_string in a file. old_string must "
             "match exactly once (include surrounding lines to make it unique).",
             _obj(["path", "old_string", "new_string"], path=_S, old_string=_S, new_string=_S)),
    ToolSpec("write_file", "Create or overwrite a file of the engine tree with the given content.",
             _obj(["path", "content"], path=_S, content=_S)),
    ToolSpec("run_shell", "Run a bash command in the workspace root (no network, time-limited, output "
             "truncated). Use it for tests and quick experiments.",
             _obj(["command"], command=_S, timeout_s={"type": "number", "description": "seconds"})),
    ToolSpec("dev_benchmark", "Measure the workspace engine's dev speed against its parent and the vanilla "
             "engine (slow: minutes). Returns the dev speed table.", _obj([])),
    ToolSpec("finish", "End the session with your report. Call it exactly once, when done (or when nothing is "
             "worth changing).",
             _obj(["report"], report={**_S, "description": "markdown: what you changed, why, what you measured"},
                  changes={"type": "array", "items": _S,
                           "description": "short kebab-case names of the changes made, e.g. 'fused-rmsnorm'"},
                  lessons={"type": "array", "items": _S, "description": "what the next session should know"})),
)


@dataclass(frozen=True)
class FinishRequest:
    report: str
    changes: tuple[str, ...] = ()
    lessons: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    is_error: bool = False
    finish: FinishRequest | None = None


@dataclass
class Toolbox:
    root: Path
    dev_benchmark: DevBenchmark | None = None
    sandbox: Sandbox = NO_SANDBOX
    hidden: tuple[Path, ...] = ()
    shell_timeout_s: float = 300.0
    calls: dict[str, int] = field(default_factory=dict)
    _home: Path | None = None

    specs = TOOL_SPECS

    def call(self, name: str, args: Any) -> ToolOutcome:
        self.calls[name] = self.calls.get(name, 0) + 1
        method = getattr(self, f"_t_{name}", None) if name in {s.name for s in TOOL_SPECS} else None
        if method is None:
            return ToolOutcome(f"unknown tool {name!r}; tools: {', '.join(s.name for s in TOOL_SPECS)}", True)
        if not isinstance(args, dict):
            return ToolOutcome(f"{name}: arguments must be a JSON object", True)
        try:
            out = method(**args)
        except ToolError as e:
            return ToolOutcome(f"{name}: {e}", True)
        except TypeError as e:  # missing / unexpected arguments
            return ToolOutcome(f"{name}: bad arguments ({e})", True)
        except OSError as e:
            return ToolOutcome(f"{name}: {e.strerror or e}", True)
        except Exception as e:  # noqa: BLE001 - a tool must never end the session; the model reads the error
            return ToolOutcome(f"{name}: {type(e).__name__}: {e}", True)
        return out if isinstance(out, ToolOutcome) else ToolOutcome(out)

    def close(self) -> None:
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    # --- the tools ---------------------------------------------------------------------------------------

    def _t_list_files(self, path: str = ".") -> str:
        base = confine(self.root, path)
        if not base.is_dir():
            raise ToolError(f"{path!r} is not a directory")
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
            for f in sorted(filenames):
                if not f.endswith(IGNORED_SUFFIXES):
                    out.append(rel(self.root, Path(dirpath) / f))
            if len(out) >= MAX_LIST:
                return "\n".join(out[:MAX_LIST]) + f"\n[... listing cut at {MAX_LIST} files]"
        return "\n".join(out) or "(empty)"

    def _t_read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        target = confine(self.root, path)
        if not target.is_file():
            raise ToolError(f"{path!r} is not a file")
        lines = target.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        a = max(1, int(start_line or 1))
        b = min(len(lines), int(end_line or len(lines)))
        text = "".join(lines[a - 1:b])
        head = f"[{rel(self.root, target)}: lines {a}-{b} of {len(lines)}]\n"
        if len(text) > MAX_READ_CHARS:
            text = text[:MAX_READ_CHARS] + "\n[... cut: read a smaller line range]"
        return head + text

    def _t_search(self, pattern: str, path: str = ".", glob: str | None = None) -> str:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ToolError(f"bad regex: {e}") from None
        base, real_root = confine(self.root, path), self.root.resolve()
        files = [base] if base.is_file() else sorted(p for p in base.rglob(glob or "*") if p.is_file()
                                                     and not set(p.relative_to(base).parts) & IGNORED_DIRS
                                                     and not p.name.endswith(IGNORED_SUFFIXES))
        hits: list[str] = []
        for f in files:
            real = f.resolve()
            if real_root not in real.parents:
                continue  # a link leading out of the workspace: not searched
            try:
                text = real.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary or unreadable
            for i, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{rel(self.root, f)}:{i}: {line[:300]}")
                    if len(hits) >= MAX_MATCHES:
                        return "\n".join(hits) + f"\n[... cut at {MAX_MATCHES} matches]"
        return "\n".join(hits) or "no matches"

    def _t_edit_file(self, path: str, old_string: str, new_string: str) -> str:
        target = confine(self.root, path, write=True)
        if not target.is_file():
            raise ToolError(f"{path!r} is not a file (write_file creates files)")
        text = target.read_text(encoding="utf-8")
        n = text.count(old_string) if old_string else 0
        if n != 1:
            raise ToolError(f"old_string must match exactly once in {path!r}; it matches {n} times"
                            + ("" if n == 0 else " (add surrounding lines to make it unique)"))
        target.write_text(text.replace(old_string, new_string, 1), encoding="utf-8")
        return f"edited {rel(self.root, target)}"

    def _t_write_file(self, path: str, content: str) -> str:
        target = confine(self.root, path, write=True)
        if target.is_dir():
            raise ToolError(f"{path!r} is a directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {rel(self.root, target)} ({len(content)} characters)"

    def _t_run_shell(self, command: str, timeout_s: float | None = None) -> str:
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        limit = min(float(timeout_s or self.shell_timeout_s), 2 * self.shell_timeout_s)
        if self._home is None:
            self._home = Path(tempfile.mkdtemp(prefix="seis-agent-home-"))
        return run_shell(command, self.root, limit, self.sandbox, self._home, self.hidden).render(limit)

    def _t_dev_benchmark(self) -> str:
        if self.dev_benchmark is None:
            raise ToolError("the dev benchmark is not available in this session")
        try:
            return truncate(self.dev_benchmark(self.root))
        except Exception as e:  # noqa: BLE001 - whatever broke, the model gets a message, the session goes on
            raise ToolError(f"dev benchmark failed: {type(e).__name__}: {e}") from None

    def _t_finish(self, report: str, changes: list[str] | None = None, lessons: list[str] | None = None):
        if not isinstance(report, str) or not report.strip():
            raise ToolError("report must be non-empty markdown")
        names = tuple(_change_name(c) for c in (changes or []) if isinstance(c, str) and _change_name(c))
        return ToolOutcome("session finished", finish=FinishRequest(report, tuple(dict.fromkeys(names)),
                                                                    tuple(str(x) for x in lessons or [])))


def _change_name(text: str) -> str:
    """'Fused RMSNorm kernel' -> 'fused-rmsnorm-kernel': names must be short, stable words for the lineage."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.strip().lower()).strip("-")[:64]


def parse_arguments(raw: str | dict | None) -> tuple[dict | None, str | None]:
    """Tool arguments as sent by the model: (args, None) or (None, why they can't be used)."""
    if isinstance(raw, dict):
        return raw, None
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as e:
        return None, f"arguments are not valid JSON ({e.msg})"
    return (value, None) if isinstance(value, dict) else (None, "arguments must be a JSON object")
