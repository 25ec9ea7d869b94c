"""agent_network="api": a cli agent reaches its model API and nothing else.

Its sandbox keeps its own network namespace (loopback only). Inside, a tiny forwarder (FORWARDER, started by the
cli wrapper before the agent's command) listens on 127.0.0.1:PROXY_PORT and relays every connection to a unix
socket shown at /seis/proxy.sock. On the host, ApiProxy serves that socket as an HTTP proxy that lets through only
the allowed endpoints (host:port pairs): `CONNECT host:port` (HTTPS) and absolute-form `http://host:port/...`
requests (plain-HTTP endpoints, e.g. a local vLLM). Anything else gets 403 and is logged. The agent's HTTP
clients find the proxy through HTTPS_PROXY / HTTP_PROXY (set by the cli agent); DNS is resolved by the proxy, on
the host, for allowed names only.
"""
from __future__ import annotations

import os
import select
import shutil
import socket
import tempfile
import threading
import time
from urllib.parse import urlsplit

from .sockets import accept_until

PROXY_PORT = 18080
MAX_HEADER_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 15.0
# A sandboxed agent is hostile until shown otherwise: it must not be able to pin the orchestrator's threads and
# file descriptors by holding connections open. Each limit below is per proxy (one per cli session).
MAX_CONNS = 64  # connections served at once, one handler thread each; more get 503 at once
HEAD_TIMEOUT_S = 10.0  # the whole request head must arrive within this (a deadline, not a per-recv timeout)
IDLE_TIMEOUT_S = 300.0  # a tunnel with no data in either direction for this long is closed

FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TOO_SLOW = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
OVERLOADED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

# Runs inside the sandbox (the interpreter SEIS runs on is part of its system view).
FORWARDER = r'''
import os, socket, threading
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
def serve(conn):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect("/seis/proxy.sock")
    except OSError:
        conn.close()
        return
    threading.Thread(target=pipe, args=(conn, up), daemon=True).start()
    pipe(up, conn)
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", %d))
srv.listen(64)
open("/tmp/.seis-proxy-ready", "w").close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
''' % PROXY_PORT

# Shell lines that start the forwarder and wait (5 s at most) until it listens.
START_FORWARDER = ('if [ -f /seis/netfwd.py ]; then python3 /seis/netfwd.py >/dev/null 2>&1 & '
                   'for _ in $(seq 100); do [ -e /tmp/.seis-proxy-ready ] && break; sleep 0.05; done; fi; ')


def endpoint(url: str) -> str:
    """'https://api.anthropic.com/v1' -> 'api.anthropic.com:443'."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    if not parts.hostname:
        raise ValueError(f"no host in API endpoint {url!r}")
    port = parts.port or (80 if parts.scheme == "http" else 443)
    return f"{parts.hostname.lower()}:{port}"


def proxy_env() -> dict[str, str]:
    url = f"http://127.0.0.1:{PROXY_PORT}"
    return {"HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url, "ALL_PROXY": url,
            "all_proxy": url, "NO_PROXY": "", "no_proxy": ""}


class ApiProxy:
    """The host side: an HTTP proxy on a unix socket, for the allowed host:port endpoints only.

    At most `max_conns` connections are served at once (the rest get 503 and count in `overloaded`); a request
    head must arrive within `head_timeout_s`; a tunnel idle for `idle_timeout_s` either way is closed."""

    def __init__(self, allowed: list[str] | tuple[str, ...], max_conns: int = MAX_CONNS,
                 head_timeout_s: float = HEAD_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S):
        if max_conns < 1 or head_timeout_s <= 0 or idle_timeout_s <= 0:
            raise ValueError("ApiProxy limits must be positive")
        self.allowed = {endpoint(a) for a in allowed}
        self.max_conns, self.head_timeout_s, self.idle_timeout_s = max_conns, head_timeout_s, idle_timeout_s
        self.refused: list[str] = []
        self.passed: list[str] = []
        self.overloaded = 0  # connections answered 503 because every slot was taken
        self.active = 0  # connections being served now (slots taken)
        self.dir = tempfile.mkdtemp(prefix="seis-proxy-")
        os.chmod(self.dir, 0o700)
        self.sock_path = os.path.join(self.dir, "proxy.sock")
        self.fwd_path = os.path.join(self.dir, "netfwd.py")
        with open(self.fwd_path, "w") as f:
            f.write(FORWARDER)
        os.chmod(self.fwd_path, 0o644)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.sock_path)
        os.chmod(self.sock_path, 0o666)  # the sandbox's user connects; the 0700 directory keeps others out
        self.sock.listen(64)
        self.sock.settimeout(0.5)
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()  # live sockets only (both ends), so close() can wake them
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="seis-api-proxy")
        self._thread.start()

    def files(self) -> dict[str, str]:
        return {"proxy.sock": self.sock_path, "netfwd.py": self.fwd_path}

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._conns.add(s)

    def _forget(self, s: socket.socket) -> None:
        # Closed under the lock: close() shuts down only sockets still tracked, never a reused descriptor.
        with self._lock:
            self._conns.discard(s)
            s.close()

    def _serve(self) -> None:
        for conn in accept_until(self.sock, self._stop):
            with self._lock:
                admitted = self.active < self.max_conns
                if admitted:
                    self.active += 1
                    self._conns.add(conn)
            if admitted:
                try:
                    threading.Thread(target=self._handle, args=(conn,), daemon=True,
                                     name="seis-api-proxy-conn").start()
                    continue
                except RuntimeError:  # the host has no thread to give: refuse it like a full proxy
                    with self._lock:
                        self.active -= 1
                        self._conns.discard(conn)
            self.overloaded += 1
            _send_quietly(conn, OVERLOADED)  # never blocks: the accept loop must stay free
            conn.close()

    def _handle(self, conn: socket.socket) -> None:
        """Serves one admitted connection; its slot is given back however this ends."""
        try:
            if not self._stop.is_set():
                self._proxy(conn)
        except OSError:
            _send_quietly(conn, BAD_GATEWAY)
        finally:
            self._forget(conn)
            with self._lock:
                self.active -= 1

    def _read_head(self, conn: socket.socket) -> bytes | None:
        """The request head (up to a blank line and what came after), or None: closed, too big or too slow."""
        deadline = time.monotonic() + self.head_timeout_s
        head = b""
        while b"\r\n\r\n" not in head:
            left = deadline - time.monotonic()
            if left <= 0 or len(head) > MAX_HEADER_BYTES:
                if left <= 0:
                    _send_quietly(conn, TOO_SLOW)
                return None
            conn.settimeout(left)
            try:
                chunk = conn.recv(4096)
            except TimeoutError:
                continue  # the deadline check above answers
            if not chunk:
                return None
            head += chunk
        return head

    def _proxy(self, conn: socket.socket) -> None:
        head = self._read_head(conn)
        if head is None:
            return
        head, rest = head.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = (lines[0].split(" ") + ["", "", ""])[:3]
        if method.upper() == "CONNECT":
            where = target.lower()
            first = b""
        elif target.lower().startswith("http://"):
            try:
                parts = urlsplit(target)
                where = f"{(parts.hostname or '').lower()}:{parts.port or 80}"
            except ValueError:  # a port that is no number or out of range, a broken [IPv6]: no endpoint at all
                _note(self.refused, f"{method} {target}")
                _send_quietly(conn, FORBIDDEN)
                return
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            headers = [h for h in lines[1:] if not h.lower().startswith(("proxy-", "connection:"))]
            first = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close"]).encode(
                "latin-1") + b"\r\n\r\n" + rest
            rest = b""
        else:
            where, first = target, b""
        if where not in self.allowed:
            _note(self.refused, f"{method} {where}")
            _send_quietly(conn, FORBIDDEN)
            return
        host, port = where.rsplit(":", 1)
        up = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        self._track(up)
        try:
            _note(self.passed, f"{method} {where}")
            conn.settimeout(self.idle_timeout_s)
            up.settimeout(self.idle_timeout_s)
            if method.upper() == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    up.sendall(rest)
            else:
                up.sendall(first)
            _relay(conn, up, self.idle_timeout_s)
        finally:
            self._forget(up)

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self._lock:
            for s in self._conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)  # wakes its handler, which closes it and frees the slot
                except OSError:
                    pass
        self._thread.join(timeout=2)
        shutil.rmtree(self.dir, ignore_errors=True)


def _send_quietly(conn: socket.socket, reply: bytes) -> None:
    """A short reply without blocking (it fits the socket buffer); a peer that is gone or not reading loses it."""
    try:
        conn.settimeout(0)
        conn.send(reply)
    except OSError:
        pass


def _relay(a: socket.socket, b: socket.socket, idle_s: float) -> None:
    """Copies bytes both ways in this one thread until a side ends or fails, or nothing moves for idle_s.

    Both sockets have timeout idle_s, so a peer that stops reading stalls sendall at most that long."""
    ends = {a.fileno(): (a, b), b.fileno(): (b, a)}
    poller = select.poll()
    for fd in ends:
        poller.register(fd, select.POLLIN)
    try:
        while events := poller.poll(idle_s * 1000):
            for fd, _ in events:
                src, dst = ends[fd]
                data = src.recv(65536)
                if not data:
                    return
                dst.sendall(data)
    except OSError:
        pass


MAX_NOTED = 200  # requests named in `passed`/`refused`: a flood of refused requests must not grow them for ever


def _note(log: list[str], what: str) -> None:
    if len(log) < MAX_NOTED:
        log.append(what[:200])
    elif len(log) == MAX_NOTED:
        log.append("... (more not listed)")
