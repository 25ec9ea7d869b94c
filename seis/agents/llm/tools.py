"""One provider-neutral tool layer for SDK agents: definitions (JSON schemas, rendered per API) and a Toolbox that
executes calls inside the workspace. A wrong call is a ToolOutcome with is_error=True, never an exception.

Arguments are checked against the declared schema before anything runs (a string where a list is declared is
an error for the model, not a list of characters). The file tools run in SEIS's own process, on paths confined
to the workspace; no agent process is alive between calls (every shell call's sandbox is killed when the call
returns), so nothing can swap a path under them. They read files streamed and capped, and say so."""
from __future__ import annotations

import fnmatch
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ...sandbox.walk import Entry, TooDeep, walk
from ...workspace.tree import IGNORED_DIRS, IGNORED_SUFFIXES, MAX_DEPTH
from .confine import AgentSandbox
from .paths import ToolError, confine, rel
from .shell import run_shell, truncate

DevBenchmark = Callable[[Path], str]  # workspace root -> the rendered dev table (render_dev_benchmark text)
MAX_READ_CHARS = 60_000               # what one read_file returns
MAX_READ_BYTES = 8 * 2**20            # what one read_file reads of a file (streamed)
MAX_EDIT_BYTES = 4 * 2**20            # files edit_file rewrites
MAX_SEARCH_FILE_BYTES = 2 * 2**20     # what search reads of one file
MAX_SEARCH_BYTES = 64 * 2**20         # what one search reads in all
MAX_LIST = 500
MAX_VISIT = 20_000                    # entries one list_files or search looks at
MAX_MATCHES = 200


@dataclass(frozen=True)
class ToolDefinition:
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
TOOL_DEFINITIONS: tuple[ToolDefinition, ...] = (
    ToolDefinition("list_files", "List files under a directory of the workspace (relative path, default '.').",
                   _obj([], path={**_S, "description": "directory relative to the workspace root"})),
    ToolDefinition("read_file", "Read a text file of the workspace, optionally a line range (1-based, inclusive).",
                   _obj(["path"], path=_S, start_line=_I, end_line=_I)),
    ToolDefinition("search",
                   "Regex search (Python syntax) over the workspace's text files; returns path:line: text.",
                   _obj(["pattern"], pattern=_S, path={**_S, "description": "directory or file, default '.'"},
                        glob={**_S, "description": "file-name glob, e.g. '*.py'"})),
    ToolDefinition("edit_file", "Replace one exact occurrence of old_string with new_string in a file. "
                   "old_string must match exactly once (include surrounding lines to make it unique).",
                   _obj(["path", "old_string", "new_string"], path=_S, old_string=_S, new_string=_S)),
    ToolDefinition("write_file", "Create or overwrite a file of the engine tree with the given content.",
                   _obj(["path", "content"], path=_S, content=_S)),
    ToolDefinition("run_shell", "Run a bash command in the workspace root (no network, time-limited, output "
                   "truncated). Use it for tests and quick experiments.",
                   _obj(["command"], command=_S, timeout_s={"type": "number", "description": "seconds"})),
    ToolDefinition("dev_benchmark", "Measure the workspace engine's dev speed against its parent and the vanilla "
                   "engine (slow: minutes). Returns the dev speed table.", _obj([])),
    ToolDefinition("finish", "End the session with your report. Call it exactly once, when done (or when nothing "
                   "is worth changing).",
                   _obj(["report"],
                        report={**_S, "description": "markdown: what you changed, why, what you measured"},
                        changes={"type": "array", "items": _S,
                                 "description": "short kebab-case names of the changes made, e.g. 'fused-rmsnorm'"},
                        lessons={"type": "array", "items": _S,
                                 "description": "what the next session should know"})),
)


def check_arguments(tool: ToolDefinition, args: Any) -> str | None:
    """Why args do not match the tool's JSON schema (the subset the definitions use), or None."""
    schema = tool.parameters
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", ()) if k not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    extra = [k for k in args if k not in props]
    if extra and schema.get("additionalProperties") is False:
        return f"unknown argument(s): {', '.join(map(str, extra))} (expected: {', '.join(props) or 'none'})"
    for key, value in args.items():
        why = _type_error(props.get(key, {}), value)
        if why:
            return f"argument {key!r} {why}"
    return None


def _type_error(schema: dict, value: Any) -> str | None:
    kind = schema.get("type")
    if kind is None:
        return None
    ok = {"string": lambda v: isinstance(v, str),
          "integer": lambda v: isinstance(v, int) and not isinstance(v, bool)
          or isinstance(v, float) and v.is_integer(),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "boolean": lambda v: isinstance(v, bool),
          "array": lambda v: isinstance(v, list),
          "object": lambda v: isinstance(v, dict)}[kind]
    if not ok(value):
        return f"must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not {_json_type(value)}"
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            why = _type_error(schema["items"], item)
            if why:
                return f"item {i} {why}"
    return None


def _json_type(v: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "an array",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


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


_DEFINITIONS = {t.name: t for t in TOOL_DEFINITIONS}


@dataclass
class Toolbox:
    root: Path
    dev_benchmark: DevBenchmark | None = None
    sandbox: AgentSandbox | None = None      # None: run_shell is unavailable (there is no unconfined shell)
    shell_timeout_s: float = 300.0
    deadline: float | None = None            # time.monotonic() of the session's end: no call runs past it
    redact: Callable[[str], str] = lambda s: s
    calls: dict[str, int] = field(default_factory=dict)

    tools = TOOL_DEFINITIONS

    def call(self, name: str, args: Any) -> ToolOutcome:
        out = self._call(name, args)
        text = self.redact(out.text)  # a tool result goes to the model: no key in it, in any form
        return out if text == out.text else ToolOutcome(text, out.is_error, out.finish)

    def _call(self, name: str, args: Any) -> ToolOutcome:
        self.calls[name] = self.calls.get(name, 0) + 1
        method = getattr(self, f"_t_{name}", None) if name in _DEFINITIONS else None
        if method is None:
            return ToolOutcome(f"unknown tool {name!r}; tools: {', '.join(t.name for t in TOOL_DEFINITIONS)}", True)
        why = check_arguments(_DEFINITIONS[name], args)
        if why is not None:
            return ToolOutcome(f"{name}: {why}", True)
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
        pass  # every shell call's sandbox (and its scratch) is gone when the call returns

    def _left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    # --- the tools ---------------------------------------------------------------------------------------

    def _t_list_files(self, path: str = ".") -> str:
        base = confine(self.root, path)
        if not base.is_dir():
            raise ToolError(f"{path!r} is not a directory")
        out: list[str] = []
        notes: list[str] = []
        for f in _files_under(self.root, base, notes):
            out.append(rel(self.root, f))
            if len(out) >= MAX_LIST:
                return "\n".join(out) + f"\n[... listing cut at {MAX_LIST} files]"
        return "\n".join(out + [f"[{n}]" for n in notes]) or "(empty)"

    def _t_read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        target = confine(self.root, path)
        if not target.is_file():
            raise ToolError(f"{path!r} is not a regular file")
        a = max(1, int(start_line or 1))
        b = None if end_line is None else int(end_line)
        if b is not None and b < a:
            raise ToolError(f"end_line {b} is before start_line {a}")
        size = target.stat().st_size
        kept: list[str] = []
        chars = read = n = 0
        cut = None
        with open(target, "rb") as f:
            while True:
                if read >= MAX_READ_BYTES:
                    cut = f"stopped reading after {MAX_READ_BYTES // 2**20} MiB of a {size}-byte file"
                    break
                line = f.readline(min(1 << 20, MAX_READ_BYTES - read))
                if not line:
                    break
                read += len(line)
                n += 1  # a line longer than 1 MiB counts as several
                if n < a:
                    continue
                if b is not None and n > b:
                    break
                text = line.decode("utf-8", errors="replace")
                if chars + len(text) > MAX_READ_CHARS:
                    kept.append(text[:MAX_READ_CHARS - chars])
                    cut = f"output cut at {MAX_READ_CHARS} characters: read a smaller line range"
                    break
                kept.append(text)
                chars += len(text)
        last = n if b is None or n < b else b
        whole = read >= size and cut is None
        of = f"of {n}" if whole and b is None else f"of a {size}-byte file"
        head = f"[{rel(self.root, target)}: lines {a}-{max(last, a - 1)} {of}]\n"
        return head + "".join(kept) + (f"\n[... {cut}]" if cut else "")

    def _t_search(self, pattern: str, path: str = ".", glob: str | None = None) -> str:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ToolError(f"bad regex: {e}") from None
        _check_glob(glob)
        base, real_root = confine(self.root, path), self.root.resolve()
        hits: list[str] = []
        notes: list[str] = []
        files = [base] if base.is_file() else (
            f for f in _files_under(self.root, base, notes)
            if not glob or _glob_match(PurePosixPath(f.relative_to(base).as_posix()), glob))
        budget = MAX_SEARCH_BYTES
        for f in files:
            real = f.resolve()
            if real_root not in real.parents or not real.is_file():
                continue  # a link leading out of the workspace, a FIFO...: not searched
            if budget <= 0:
                notes.append(f"search stopped after reading {MAX_SEARCH_BYTES // 2**20} MiB; narrow path or glob")
                break
            try:
                with open(real, "rb") as fh:
                    data = fh.read(min(MAX_SEARCH_FILE_BYTES, budget) + 1)
            except OSError:
                continue  # unreadable
            budget -= len(data)
            if b"\0" in data[:8192]:
                continue  # binary
            if len(data) > MAX_SEARCH_FILE_BYTES:
                data = data[:MAX_SEARCH_FILE_BYTES]
                notes.append(f"{rel(self.root, f)}: only its first {MAX_SEARCH_FILE_BYTES // 2**20} MiB searched")
            text = data.decode("utf-8", errors="replace")
            for i, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{rel(self.root, f)}:{i}: {line[:300]}")
                    if len(hits) >= MAX_MATCHES:
                        return "\n".join(hits + notes) + f"\n[... cut at {MAX_MATCHES} matches]"
        return "\n".join(hits + [f"[{n}]" for n in notes]) or "no matches"

    def _t_edit_file(self, path: str, old_string: str, new_string: str) -> str:
        target = confine(self.root, path, write=True)
        if not target.is_file():
            raise ToolError(f"{path!r} is not a file (write_file creates files)")
        if target.stat().st_size > MAX_EDIT_BYTES:
            raise ToolError(f"{path!r} is larger than {MAX_EDIT_BYTES // 2**20} MiB; edit_file edits source files")
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
        if not command.strip():
            raise ToolError("command must be a non-empty string")
        if timeout_s is not None and not timeout_s > 0:
            raise ToolError("timeout_s must be > 0 seconds")
        if self.sandbox is None:
            raise ToolError("run_shell is not available in this session (no sandbox)")
        limit = min(float(timeout_s or self.shell_timeout_s), 2 * self.shell_timeout_s)
        left = self._left()
        if left is not None:
            if left < 1:
                raise ToolError("the session's time is spent")
            limit = min(limit, left)
        return run_shell(command, self.root, limit, self.sandbox).render(limit)

    def _t_dev_benchmark(self) -> str:
        if self.dev_benchmark is None:
            raise ToolError("the dev benchmark is not available in this session")
        left = self._left()
        if left is not None and left < 1:
            raise ToolError("the session's time is spent")
        try:
            return truncate(self.dev_benchmark(self.root))
        except Exception as e:  # noqa: BLE001 - whatever broke, the model gets a message, the session goes on
            raise ToolError(f"dev benchmark failed: {type(e).__name__}: {e}") from None

    def _t_finish(self, report: str, changes: list[str] | None = None, lessons: list[str] | None = None):
        if not report.strip():
            raise ToolError("report must be non-empty markdown")
        names = tuple(n for n in (_change_name(self.redact(c)) for c in changes or []) if n)
        return ToolOutcome("session finished", finish=FinishRequest(report, tuple(dict.fromkeys(names)),
                                                                    tuple(lessons or [])))


def _check_glob(glob: str | None) -> None:
    """A search glob names files under the searched directory: never a parent ('..') or an absolute path."""
    if glob is None:
        return
    if not glob.strip() or "\0" in glob:
        raise ToolError("glob must be a non-empty file-name pattern such as '*.py'")
    if os.path.isabs(glob) or glob.startswith("~") or ".." in PurePosixPath(glob.replace("\\", "/")).parts:
        raise ToolError(f"refused: glob {glob!r} leaves the searched directory ('..' or an absolute path); "
                        "use a pattern such as '*.py' or 'engine/*.py' and the path argument")


def _glob_match(rel_path: PurePosixPath, glob: str) -> bool:
    """Whether a file (its path under the searched directory) matches the glob as Path.rglob would take it:
    '*.py' matches at any depth, 'engine/*.py' by its last parts, a leading '**/' matches any parent."""
    while glob.startswith("**/"):
        glob = glob[3:]
    return bool(glob) and (rel_path.match(glob) or fnmatch.fnmatchcase(rel_path.as_posix(), glob))


def _files_under(root: Path, base: Path, notes: list[str]) -> Iterator[Path]:
    """The regular files under base (a directory of the workspace at root), directory by directory in sorted
    order, skipping caches. Hostile trees are bounded: no link is followed or listed, nothing deeper than
    MAX_DEPTH levels is entered, and at most MAX_VISIT entries are looked at (each limit reached adds a note)."""
    def enter(entry: os.DirEntry) -> bool:
        return entry.name not in IGNORED_DIRS

    for seen, item in enumerate(walk(base, enter=enter), 1):
        if seen > MAX_VISIT:
            notes.append(f"stopped after looking at {MAX_VISIT:,} entries; narrow the path")
            return
        if isinstance(item, TooDeep) and item.path.name not in IGNORED_DIRS:
            notes.append(f"{rel(root, item.path)}/: more than {MAX_DEPTH} directories deep, not entered")
        elif isinstance(item, Entry) and item.dir_entry.is_file(follow_symlinks=False) \
                and not item.dir_entry.name.endswith(IGNORED_SUFFIXES):
            yield item.path


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
