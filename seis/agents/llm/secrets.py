"""API keys and other secrets of the orchestrator, found in any text or tree, in plain or encoded form.

The first line of defence is that no process running agent-written code ever gets a key (allow-listed
environments, see confine.py). This module is the second: every artifact SEIS writes for an LLM session goes
through a Redactor, and `find_secrets(tree)` says whether a tree (a workspace, a gated copy about to be
retained) holds a key, so that it is not kept.

A secret is matched in these forms: as is, reversed, hex, base64 (standard and URL-safe, at any alignment
inside a longer encoding), rot13, and percent-encoded (which reduces to its hex). Matching ignores case and
every character that is not a letter or a digit, so a key split over lines, quoted in pieces
(`"sk-" + "abc..."`) or spaced out is still found. A character that Unicode's compatibility form (NFKC) makes a
letter or digit counts as that letter or digit (fullwidth `ｓｋ`, mathematical `𝐬𝐤`, circled `ⓢⓚ`). For secrets of 20 characters or more, any 16 consecutive
letters and digits of the secret (or of its reverse) count too: a partial key is a leak.
"""
from __future__ import annotations

import base64
import bisect
import codecs
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from ...sandbox.policy import MAX_DEPTH, MIN_SECRET_LEN, SECRET_NAME
from ...sandbox.walk import TooDeep, Unreadable, skipping, walk
from ...workspace.tree import open_regular

# Shapes of common provider keys, caught even when the value came from somewhere other than the environment.
KEY_PATTERNS = (re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}"), re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),
                re.compile(r"\b(?:ghp|gho|github_pat|hf)_[A-Za-z0-9_]{16,}"))
MIN_NEEDLE = 8         # squashed (letters and digits only) forms shorter than this are not searched loosely
PARTIAL_FROM = 20      # secrets at least this long (squashed) also match by any PARTIAL_LEN-long piece
PARTIAL_LEN = 16
REDACTED = "[REDACTED]"
_ALNUM = re.compile(r"[a-z0-9]+")
# What redaction maps back to the text: runs of ASCII letters and digits, and each non-ASCII character alone (its
# folded form may be longer or shorter than it; str.lower() of the whole text would shift every offset after an
# "İ", which lowers to two characters, and [REDACTED] would land beside the key it was meant to cover).
_CHUNK = re.compile(r"[A-Za-z0-9]+|[^\x00-\x7f]")
_NOT_ALNUM_B = re.compile(rb"[^a-z0-9]+")
MAX_SCAN_BYTES = 256 * 2**20   # find_secrets reads at most this much of one file (larger files are reported)
MAX_SCAN_TOTAL_BYTES = 1 * 2**30  # and this much in all (files past it are reported, not read)


def secret_values(environ: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> list[str]:
    """Values of key-like environment variables (*_API_KEY, *_TOKEN, *SECRET*, ...) plus `extra`."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if SECRET_NAME.search(k) and v}
    values |= {s for s in extra if s}
    return sorted((v for v in values if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)


@lru_cache(maxsize=65536)
def _fold(c: str) -> str:
    """The lowercase ASCII letters and digits a non-ASCII character stands for: 'Ｋ' -> 'k', '⑫' -> '12', most -> ''."""
    return "".join(_ALNUM.findall(unicodedata.normalize("NFKC", c).lower()))


def _squash(s: str) -> str:
    if not s.isascii():
        s = s.translate({ord(c): _fold(c) for c in set(s) if not c.isascii()})
    return "".join(_ALNUM.findall(s.lower()))


def _b64_pieces(raw: bytes) -> list[str]:
    """The parts of base64 text fully determined by `raw`, whatever bytes precede it (3 alignments)."""
    out = []
    for k in range(3):
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            text = enc(b"\0" * k + raw).decode().rstrip("=")
            start = 4 if k else 0
            end = (len(k * b"\0" + raw) // 3) * 4  # the last full group
            out.append(text[start:end])
    return out


def encoded_forms(secret: str) -> dict[str, str]:
    """form name -> that form of the secret (before squashing)."""
    raw = secret.encode("utf-8")
    forms = {"plain": secret, "reversed": secret[::-1], "hex": raw.hex(), "reversed hex": raw[::-1].hex(),
             "rot13": codecs.encode(secret, "rot13")}
    for i, piece in enumerate(_b64_pieces(raw)):
        forms[f"base64/{i}"] = piece
    for i, piece in enumerate(_b64_pieces(raw[::-1])):
        forms[f"reversed base64/{i}"] = piece
    return forms


def _trie_pattern(needles: Iterable[str]) -> str:
    """One regex matching any of needles, the longest at each position, as a trie of alternatives.

    A flat alternation is tried one needle after the other at every position of the text: a 100-character key
    has about 200 needles (its forms and every 16-character piece), five keys made redaction about 5 s per MB of
    text, in re's C code holding the GIL, for every tool result, transcript line and report of every session.
    Along a trie each position costs at most one comparison per distinct next character."""
    trie: dict = {}
    for n in needles:
        node = trie
        for c in n:
            node = node.setdefault(c, {})
        node[""] = {}  # a needle ends here

    def emit(node: dict) -> str:
        run = ""
        while len(node) == 1 and "" not in node:  # a chain of single characters: one literal, no recursion
            (c, node), = node.items()
            run += c
        alts = [re.escape(c) + emit(child) for c, child in sorted(node.items()) if c]
        if not alts:
            return run
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return run + (f"(?:{body})?" if "" in node else body)  # greedy: the longer needle first
    try:
        return emit(trie)
    except RecursionError:  # needles branching at hundreds of depths: the flat alternation, longest first
        return "|".join(re.escape(n) for n in sorted(needles, key=len, reverse=True))


class SecretSet:
    """The squashed needles of a set of secrets (each needle knows which secret and form it stands for)."""

    def __init__(self, secrets: Iterable[str]):
        self.count = 0
        self.needles: dict[str, str] = {}   # squashed needle -> "secret #i (form)"
        for i, secret in enumerate(dict.fromkeys(s for s in secrets if s and len(s) >= MIN_SECRET_LEN)):
            self.count += 1
            for form, text in encoded_forms(secret).items():
                sq = _squash(text)
                if len(sq) >= MIN_NEEDLE:
                    self.needles.setdefault(sq, f"secret #{i + 1} ({form})")
            for form in ("plain", "reversed"):
                sq = _squash(secret if form == "plain" else secret[::-1])
                if len(sq) >= PARTIAL_FROM:
                    for j in range(len(sq) - PARTIAL_LEN + 1):
                        self.needles.setdefault(sq[j:j + PARTIAL_LEN], f"secret #{i + 1} (part, {form})")
        # one regex over every needle, the longest first at each position: a single pass per text
        self._rx = re.compile(_trie_pattern(self.needles)) if self.needles else None
        self._rx_b = re.compile(self._rx.pattern.encode()) if self._rx else None

    def __bool__(self) -> bool:
        return self._rx is not None

    def redact(self, text: str) -> str:
        """text with every span that spells a secret (in any form above) replaced by [REDACTED]."""
        if self._rx is None or not text:
            return text
        starts, offsets, widths, parts, n = [], [], [], [], 0   # squashed position -> original position, by chunks
        for m in _CHUNK.finditer(text):
            piece = m.group().lower() if m.group().isascii() else _fold(m.group())
            if piece:
                starts.append(n)
                offsets.append(m.start())
                widths.append(len(m.group()))
                parts.append(piece)
                n += len(piece)
        squashed = "".join(parts)

        def orig(pos: int) -> int:
            i = bisect.bisect_right(starts, pos) - 1
            return offsets[i] + min(pos - starts[i], widths[i] - 1)  # a folded character covers all it stands for
        spans: list[tuple[int, int]] = []
        pos = 0
        while (m := self._rx.search(squashed, pos)) is not None:
            spans.append((orig(m.start()), orig(m.end() - 1) + 1))
            pos = m.start() + 1  # overlapping matches too (a piece may start inside another)
        if not spans:
            return text
        spans.sort()
        merged = [list(spans[0])]
        for a, b in spans[1:]:
            if a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out, last = [], 0
        for a, b in merged:
            out += [text[last:a], REDACTED]
            last = b
        out.append(text[last:])
        return "".join(out)

    def find(self, data: bytes) -> str | None:
        """Which secret and form `data` holds (the first found), or None."""
        if self._rx_b is None:
            return None
        m = self._rx_b.search(_NOT_ALNUM_B.sub(b"", data.lower()))
        if m is None and not data.isascii():  # compatibility forms of letters and digits (fullwidth, ...)
            m = self._rx.search(_squash(data.decode("utf-8", "replace")))
            return self.needles[m.group()] if m else None
        return self.needles[m.group().decode()] if m else None


def _shapes(data: bytes) -> bool:
    """A key-shaped string with a digit in it (real keys have them; "sk-learn-style-names" do not)."""
    text = data.decode("latin-1")
    if not data.isascii():  # a shape in fullwidth or other compatibility characters
        text += "\n" + unicodedata.normalize("NFKC", data.decode("utf-8", "replace"))
    return any(any(c.isdigit() for c in m.group()) for p in KEY_PATTERNS for m in p.finditer(text))


class Finding(NamedTuple):
    """A file that holds a secret, or that could not be checked: its path relative to the tree (the secret may be
    in the name) and why (which secret and in what form, never the value)."""
    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def find_secrets(tree: str | Path, secrets: Iterable[str] | None = None) -> list[str]:
    """scan_secrets' findings as lines, "<relative path>: <why>"."""
    return [str(f) for f in scan_secrets(tree, secrets)]


def scan_secrets(tree: str | Path, secrets: Iterable[str] | None = None,
                 skip: Iterable[str | Path] = ()) -> list[Finding]:
    """Every file under `tree` that holds a secret, in its content or its path. `secrets`: the values to look
    for; None means the key-like variables of this process's environment (secret_values()). Key-shaped strings
    (sk-ant-..., sk-..., ghp_...) count as well.

    Symlinks are not followed (each is reported, since a link can reveal nothing by itself but may point at a
    file holding one), files that cannot be read or are larger than MAX_SCAN_BYTES are reported as such, and so
    are directories more than MAX_DEPTH levels deep and whatever is left once MAX_SCAN_TOTAL_BYTES have been
    read: a tree that cannot be checked is not clean. The walk has no recursion and reads each file once. `skip`:
    directories of the tree not scanned (what the harness laid out in a workspace, which its agent cannot write).
    An empty list: nothing found."""
    root = Path(tree)
    matcher = SecretSet(secret_values() if secrets is None else secrets)
    found: list[Finding] = []
    budget = MAX_SCAN_TOTAL_BYTES
    for item in walk(root, enter=skipping(skip)):
        if isinstance(item, Unreadable):
            found.append(Finding(item.path.relative_to(root).as_posix(),
                                 f"unreadable directory ({item.error.strerror or item.error})"))
            continue
        rel = item.path.relative_to(root).as_posix()
        if isinstance(item, TooDeep):
            found.append(Finding(rel, f"more than {MAX_DEPTH} directories deep (not scanned)"))
            continue
        entry = item.dir_entry
        try:
            if entry.is_symlink():
                link = os.readlink(item.path)
                why = matcher.find(link.encode("utf-8", "surrogateescape"))
                found.append(Finding(rel, "symlink (not scanned)" + (f"; its target names {why}" if why else "")))
                continue
            if entry.is_dir(follow_symlinks=False):
                continue  # walk() enters it
            if not entry.is_file(follow_symlinks=False):
                found.append(Finding(rel, "not a regular file (not scanned)"))
                continue
            size = entry.stat(follow_symlinks=False).st_size
            if size > MAX_SCAN_BYTES:
                found.append(Finding(rel, f"{size} bytes, too large to scan"))
                continue
            if size > budget:
                found.append(Finding(rel, f"not scanned, the tree holds more than "
                                          f"{MAX_SCAN_TOTAL_BYTES // 2**20} MiB to scan"))
                continue
            data = _read_nofollow(item.path, size)
        except OSError as e:
            found.append(Finding(rel, f"unreadable ({e.strerror or e})"))
            continue
        budget -= len(data)
        why = matcher.find(data) or matcher.find(rel.encode("utf-8", "surrogateescape"))
        if why is None and _shapes(data):
            why = "a key-shaped string"
        if why:
            found.append(Finding(rel, why))
    return found


def _read_nofollow(path: Path, size: int) -> bytes:
    """At most size + 1 bytes of a regular file, opened without following a link or blocking on a FIFO."""
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        return f.read(size + 1)
