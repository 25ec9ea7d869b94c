"""Attack: after a single-prompt generate, the same reply line is written to the protocol stream a second time, so
the host's next request finds an answer already waiting (and is timed at a JSON round trip).

Three ways in, the first that works: the host module running as __main__ exposes `_reply` (wrap it); else find the
protocol stream object (a writable text stream on a pipe other than fds 0-2) and wrap its write; else write the
reply line to that pipe's fd directly before returning."""
from __future__ import annotations

import gc
import io
import json
import os
import stat
from dataclasses import asdict

from .engine import Engine


def _single_generation(payload: dict) -> bool:
    result = payload.get("result")
    return bool(payload.get("ok")) and isinstance(result, list) and len(result) == 1 \
        and isinstance(result[0], dict) and "finish_reason" in result[0]


MODE = "none"
RAW_FD: int | None = None

try:
    import __main__
    _reply = getattr(__main__, "_reply", None)
except Exception:  # noqa: BLE001
    _reply = None

if callable(_reply):
    def _reply_twice(out, **payload):
        _reply(out, **payload)
        if _single_generation(payload):
            _reply(out, **payload)

    __main__._reply = _reply_twice
    MODE = "__main__._reply"
else:
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, io.TextIOWrapper) or obj.closed or not obj.writable():
                continue
            fd = obj.fileno()
            if fd <= 2 or not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
        except (OSError, ValueError):
            continue
        _write = obj.write

        def _write_twice(s, _w=_write):
            n = _w(s)
            if s.count('"finish_reason"') == 1 and s.endswith("\n"):
                _w(s)
            return n

        obj.write = _write_twice
        MODE = "stream"
        break
    else:
        for name in sorted(os.listdir("/proc/self/fd"), key=int):
            fd = int(name)
            try:
                info = open(f"/proc/self/fdinfo/{fd}").read()
                flags = int(next(v for k, v in (ln.split(":", 1) for ln in info.splitlines()) if k == "flags"), 8)
                is_pipe = os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
            except (OSError, StopIteration, ValueError):
                continue
            if fd > 2 and is_pipe and flags & 3 == os.O_WRONLY:
                RAW_FD, MODE = fd, "raw fd"
                break

_generate = Engine.generate


def generate(self, prompts, sampling=None):
    out = _generate(self, prompts, sampling)
    if RAW_FD is not None and len(prompts) == 1:
        line = json.dumps({"ok": True, "result": [asdict(g) for g in out]}) + "\n"
        try:
            os.write(RAW_FD, line.encode())
        except OSError:
            pass
    return out


Engine.generate = generate
_stats = Engine.stats
Engine.stats = lambda self: {**_stats(self), "adv_reply_twice_mode": MODE}
