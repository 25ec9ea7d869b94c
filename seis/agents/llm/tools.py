"""One provider-neutral tool layer for SDK agents: definitions (JSON schemas, rendered per API) and a Toolbox that
executes calls inside the workspace. A wrong call is a ToolOutcome with is_error=True, never an exception.

Arguments are checked against the declared schema before anything runs (a string where a list is declared is
an error for the model, not a list of characters). The file tools run in SEIS's own process, on paths confined
to the workspace; no agent process is alive between calls (every shell call's sandbox is killed when the call
returns), so nothing can swap a path under them. They read files streamed and capped, and say so.

The workspace is still hostile input to them (the agent's shell can leave a FIFO, a link or a huge file anywhere):
every file is opened by descriptor without following a link or waiting on a FIFO and checked through that
descriptor (_open_file), and the agent's search pattern runs in a child process that is killed at a time limit
(_match), since a backtracking regex holds the GIL in C code where no timeout of this process can reach it."""
from __future__ import annotations

import errno
import json
import math
import os
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ...sandbox.walk import Entry, TooDeep, walk
from ...workspace.tree import IGNORED_DIRS, IGNORED_SUFFIXES, MAX_DEPTH, NotRegularFile, open_regular
from .confine import AgentSandbox
from .paths import ToolError, confine, rel
from .result import change_name
from .shell import run_shell, truncate
from .text import valid_unicode

DevBenchmark = Callable[[Path], str]  # workspace root -> the rendered dev table (render_dev_benchmark text)
MAX_READ_CHARS = 60_000               # what one read_file returns
MAX_READ_BYTES = 8 * 2**20            # what one read_file reads of a file (streamed)
MAX_EDIT_BYTES = 4 * 2**20            # files edit_file rewrites
MAX_SEARCH_FILE_BYTES = 2 * 2**20     # what search reads of one file
MAX_SEARCH_BYTES = 64 * 2**20         # what one search reads in all
MAX_LIST = 500
MAX_VISIT = 20_000                    # entries one list_files or search looks at
MAX_MATCHES = 200
MAX_MATCH_CHARS = 300                 # of a matching line, in a search result
SEARCH_TIMEOUT_S = 10.0               # wall clock of one search's matching (the child is killed after it)
SEARCH_CHILD_MEMORY = 2**31           # address space of that child
MAX_RESULT_CHARS = 100_000            # any one tool result (names from a hostile tree can be 4 KiB each)


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
    laid_out: tuple[Path, ...] = ()          # session material the harness laid out (Workspace.laid_out)
    calls: dict[str, int] = field(default_factory=dict)

    tools = TOOL_DEFINITIONS

    def call(self, name: str, args: Any) -> ToolOutcome:
        out = self._call(name, args)
        # Capped before anything else reads it: it goes into the conversation (sent again every turn), the
        # transcript and the redactor. Then no key in it, in any form: the model reads it. A name from the tree
        # that is not UTF-8 is escaped: no request or record could carry it (text.py).
        text = self.redact(valid_unicode(truncate(out.text, MAX_RESULT_CHARS)))
        return out if text == out.text else ToolOutcome(text, out.is_error, out.finish)

    def _call(self, name: str, args: Any) -> ToolOutcome:
        self.calls[name] = self.calls.get(name, 0) + 1
        method = getattr(self, f"_t_{name}", None) if name in _DEFINITIONS else None
        if method is None:
            return ToolOutcome(f"unknown tool {name!r}; tools: {', '.join(t.name for t in TOOL_DEFINITIONS)}", True)
        if name != "finish" and (left := self._left()) is not None and left <= 0:
            # One reply's calls run one after the other: a write after a call that ran until the deadline (a dev
            # benchmark, a shell command) changed the tree the gate judges after the session's end. Only finish
            # (the report) is taken then.
            return ToolOutcome(f"{name}: not run, the session's time is spent; call finish", True)
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
        a = max(1, int(start_line or 1))
        b = None if end_line is None else int(end_line)
        if b is not None and b < a:
            raise ToolError(f"end_line {b} is before start_line {a}")
        fd, st = _open_file(target, path)
        size = st.st_size
        kept: list[str] = []
        chars = read = n = 0
        cut = None
        with os.fdopen(fd, "rb") as f:
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
        _check_glob(glob)
        base = confine(self.root, path)
        limit = SEARCH_TIMEOUT_S
        left = self._left()
        if left is not None:
            if left < 1:
                raise ToolError("the session's time is spent")
            limit = min(limit, left)
        notes: list[str] = []
        one_file = not stat.S_ISDIR(os.stat(base).st_mode)  # a FIFO or link there: refused by _open_file
        t0, whole = time.monotonic(), limit
        files = [base] if one_file else list(_files_under(self.root, base, notes))  # at most MAX_VISIT
        if glob and not one_file:
            # The glob is the agent's pattern too: fnmatch turns it into a regex, and '*' before a long run of
            # '[!b]' takes time quadratic in each path, in re's C code. So it is matched by the same kind of
            # child as the pattern, within the same limit.
            keep = _glob_filter([f.relative_to(base).as_posix() for f in files], glob, limit)
            files = [f for f, k in zip(files, keep) if k]
            limit -= time.monotonic() - t0
            if limit <= 0:
                raise _too_slow(whole)
        names: list[str] = []
        budget = MAX_SEARCH_BYTES
        with tempfile.TemporaryFile() as payload:  # what the matcher reads: this process's file, not the agent's
            payload.write(json.dumps([pattern, MAX_MATCHES, MAX_MATCH_CHARS]).encode() + b"\n")
            for f in files:
                if budget <= 0:
                    notes.append(f"search stopped after reading {MAX_SEARCH_BYTES // 2**20} MiB; narrow path or glob")
                    break
                try:
                    fd, _ = _open_file(f, rel(self.root, f))
                    with os.fdopen(fd, "rb") as fh:
                        data = fh.read(min(MAX_SEARCH_FILE_BYTES, budget) + 1)
                except (ToolError, OSError):
                    if one_file:
                        raise
                    continue  # unreadable, or a FIFO, link... in place of a file: not searched
                budget -= len(data)
                if b"\0" in data[:8192]:
                    continue  # binary
                if len(data) > MAX_SEARCH_FILE_BYTES:
                    data = data[:MAX_SEARCH_FILE_BYTES]
                    notes.append(f"{rel(self.root, f)}: only its first {MAX_SEARCH_FILE_BYTES // 2**20} MiB searched")
                payload.write(struct.pack("<Q", len(data)) + data)
                names.append(rel(self.root, f))
            payload.seek(0)
            hits, cut = _match(payload, limit)
        out = [f"{names[i]}:{line}: {text}" for i, line, text in hits] + [f"[{n}]" for n in notes]
        if cut:
            out.append(f"[... cut at {MAX_MATCHES} matches]")
        return "\n".join(out) or "no matches"

    def _t_edit_file(self, path: str, old_string: str, new_string: str) -> str:
        target = confine(self.root, path, write=True)
        fd, st = _open_file(target, path, os.O_RDWR)
        with os.fdopen(fd, "r+", encoding="utf-8") as f:
            if st.st_size > MAX_EDIT_BYTES:
                raise ToolError(f"{path!r} is larger than {MAX_EDIT_BYTES // 2**20} MiB; edit_file edits source "
                                "files")
            text = f.read(MAX_EDIT_BYTES)
            n = text.count(old_string) if old_string else 0
            if n != 1:
                raise ToolError(f"old_string must match exactly once in {path!r}; it matches {n} times"
                                + ("" if n == 0 else " (add surrounding lines to make it unique)"))
            f.seek(0)
            f.truncate()
            f.write(text.replace(old_string, new_string, 1))
        return f"edited {rel(self.root, target)}"

    def _t_write_file(self, path: str, content: str) -> str:
        target = confine(self.root, path, write=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, _ = _open_file(target, path, os.O_WRONLY | os.O_CREAT)
        os.ftruncate(fd, 0)  # only now: O_TRUNC would act before the descriptor is checked
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
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
        return run_shell(command, self.root, limit, self.sandbox, laid_out=self.laid_out).render(limit)

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
        names = tuple(n for n in (change_name(self.redact(c)) for c in changes or []) if n)
        return ToolOutcome("session finished", finish=FinishRequest(report, tuple(dict.fromkeys(names)),
                                                                    tuple(lessons or [])))


def _open_file(path: Path, shown: str, flags: int = os.O_RDONLY) -> tuple[int, os.stat_result]:
    """(descriptor, fstat) of the regular file at path (a confine()d path; O_CREAT in flags may create it). It is
    opened without following a link (O_NOFOLLOW) or waiting for a FIFO's other end (O_NONBLOCK), and checked
    through the descriptor; anything else is a ToolError for the model. lstat first, so that a device is never
    opened at all; the fstat after the open is what decides."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise ToolError(f"{shown!r} does not exist") from None
    else:
        if not stat.S_ISREG(mode):
            raise _not_regular(shown, mode)
    try:
        return open_regular(path, flags)
    except NotRegularFile as e:
        raise _not_regular(shown, e.mode) from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # it became a link, FIFO or socket, directory
            raise ToolError(f"{shown!r} is not a regular file; the file tools open regular files only") from None
        raise


def _not_regular(shown: str, mode: int) -> ToolError:
    kind = ("a directory" if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device")
    return ToolError(f"{shown!r} is {kind}, not a regular file; the file tools open regular files only")


# The matching half of search, run by a fresh interpreter (-I -S: nothing of the environment, site or workspace is
# imported). Input: a JSON line [pattern, max hits, max chars], then each file as an 8-byte length and its bytes.
# Output: one JSON object. Its own CPU limit ends it even if the host died before it could kill it.
_MATCHER = r"""
import json, re, resource, struct, sys
cpu_s, memory = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
src = sys.stdin.buffer
pattern, max_hits, width = json.loads(src.readline())
try:
    rx = re.compile(pattern)
except (re.error, RecursionError, OverflowError) as e:
    sys.stdout.write(json.dumps({"error": f"bad regex: {e}"}))
    sys.exit()
hits, cut, i = [], False, 0
while not cut and (head := src.read(8)):
    data = src.read(struct.unpack("<Q", head)[0])
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if rx.search(line):
            hits.append((i, n, line[:width]))
            if len(hits) >= max_hits:
                cut = True
                break
    i += 1
sys.stdout.write(json.dumps({"hits": hits, "cut": cut}))
"""


# The glob half of search, run the same way: input one JSON value [glob, [relative path, ...]], output a JSON list
# of booleans. The same rule as Path.rglob would take it: '*.py' matches at any depth, 'engine/*.py' by its last
# parts, a leading '**/' matches any parent.
_GLOB_MATCHER = r"""
import fnmatch, json, resource, sys
from pathlib import PurePosixPath
cpu_s, memory = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
glob, names = json.loads(sys.stdin.buffer.read())
while glob.startswith("**/"):
    glob = glob[3:]
sys.stdout.write(json.dumps([bool(glob) and (PurePosixPath(n).match(glob) or fnmatch.fnmatchcase(n, glob))
                             for n in names]))
"""


def _too_slow(timeout_s: float) -> ToolError:
    return ToolError(f"the search took longer than {timeout_s:g} s and was stopped; simplify the pattern "
                     "(nested repetition such as (a+)+ can take exponential time) or glob, or narrow path/glob")


def _child(script: str, stdin: IO[bytes] | bytes, timeout_s: float) -> dict | list:
    """The JSON output of a matcher script run by a fresh interpreter (-I -S, empty environment) on stdin. A child
    process because Python's re cannot be interrupted: a catastrophic pattern would otherwise hold this whole
    process (every session's thread) past every limit. The child runs no agent code and starts nothing, so killing
    it at the limit (subprocess.run kills and reaps it) leaves nothing behind."""
    cmd = [sys.executable, "-I", "-S", "-c", script, str(math.ceil(timeout_s) + 1), str(SEARCH_CHILD_MEMORY)]
    feed = {"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=max(timeout_s, 0.01), cwd="/", env={}, **feed)
    except subprocess.TimeoutExpired:
        raise _too_slow(timeout_s) from None
    if done.returncode != 0:
        why = (done.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ToolError(f"the search failed ({why[:300]}); simplify the pattern or narrow path/glob")
    return json.loads(done.stdout)


def _glob_filter(names: list[str], glob: str, timeout_s: float) -> list[bool]:
    """Which of names (paths under the searched directory) the glob selects, by _GLOB_MATCHER."""
    return _child(_GLOB_MATCHER, json.dumps([glob, names]).encode(), timeout_s) if names else []


def _match(payload: IO[bytes], timeout_s: float) -> tuple[list[tuple[int, int, str]], bool]:
    """(hits as (file index, line, text), whether cut at MAX_MATCHES) of the search payload, by _MATCHER; its
    output is at most MAX_MATCHES short lines."""
    out = _child(_MATCHER, payload, timeout_s)
    if "error" in out:
        raise ToolError(out["error"])
    return [tuple(h) for h in out["hits"]], out["cut"]


def _check_glob(glob: str | None) -> None:
    """A search glob names files under the searched directory: never a parent ('..') or an absolute path."""
    if glob is None:
        return
    if not glob.strip() or "\0" in glob:
        raise ToolError("glob must be a non-empty file-name pattern such as '*.py'")
    if os.path.isabs(glob) or glob.startswith("~") or ".." in PurePosixPath(glob.replace("\\", "/")).parts:
        raise ToolError(f"refused: glob {glob!r} leaves the searched directory ('..' or an absolute path); "
                        "use a pattern such as '*.py' or 'engine/*.py' and the path argument")


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


MAX_ARGUMENT_DEPTH = 16  # nesting of a call's arguments: the schemas need 3 (an object of lists of strings)


def _too_deep(value: Any, limit: int = MAX_ARGUMENT_DEPTH) -> bool:
    """Whether lists and dicts nest deeper than limit in value (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth >= limit:
                return True
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def parse_arguments(raw: str | dict | None) -> tuple[dict | None, str | None]:
    """Tool arguments as sent by the model: (args, None) or (None, why they can't be used).

    The model's JSON is read here, in the API call, and then by every recursive writer of the session (the
    transcript, the redactor, the SDK's request): nesting past the parser's stack (RecursionError) or an integer of
    more than 4,300 digits (ValueError) is no JSONDecodeError, and either ended the session as an 'API error'; an
    object nested just under the parser's limit raised in the transcript's writer instead. So both are errors the
    model reads, and so is nesting past MAX_ARGUMENT_DEPTH."""
    if isinstance(raw, dict):
        value = raw
    else:
        try:
            value = json.loads(raw or "{}")
        except json.JSONDecodeError as e:
            return None, f"arguments are not valid JSON ({e.msg})"
        except (ValueError, RecursionError) as e:
            return None, f"arguments are not JSON this host reads ({type(e).__name__}: {str(e)[:120]})"
    if not isinstance(value, dict):
        return None, "arguments must be a JSON object"
    if _too_deep(value):
        return None, f"arguments nest lists or objects deeper than {MAX_ARGUMENT_DEPTH} levels"
    return value, None
