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
import shutil
import socket
import tempfile
import threading
from urllib.parse import urlsplit

from .sockets import accept_until

PROXY_PORT = 18080
MAX_HEADER_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 15.0

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
    """The host side: an HTTP proxy on a unix socket, for the allowed host:port endpoints only."""

    def __init__(self, allowed: list[str] | tuple[str, ...]):
        self.allowed = {endpoint(a) for a in allowed}
        self.refused: list[str] = []
        self.passed: list[str] = []
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
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="seis-api-proxy")
        self._thread.start()

    def files(self) -> dict[str, str]:
        return {"proxy.sock": self.sock_path, "netfwd.py": self.fwd_path}

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._conns.append(s)

    def _serve(self) -> None:
        for conn in accept_until(self.sock, self._stop):
            self._track(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk or len(head) > MAX_HEADER_BYTES:
                    conn.close()
                    return
                head += chunk
            head, rest = head.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = (lines[0].split(" ") + ["", "", ""])[:3]
            if method.upper() == "CONNECT":
                where = target.lower()
                first = b""
            elif target.lower().startswith("http://"):
                parts = urlsplit(target)
                where = f"{(parts.hostname or '').lower()}:{parts.port or 80}"
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                headers = [h for h in lines[1:] if not h.lower().startswith(("proxy-", "connection:"))]
                first = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close"]).encode(
                    "latin-1") + b"\r\n\r\n" + rest
                rest = b""
            else:
                where, first = target, b""
            if where not in self.allowed:
                self.refused.append(f"{method} {where}")
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
                return
            host, port = where.rsplit(":", 1)
            up = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
            self._track(up)
            self.passed.append(f"{method} {where}")
            if method.upper() == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    up.sendall(rest)
            else:
                up.sendall(first)
            conn.settimeout(None)
            up.settimeout(None)
            threading.Thread(target=_pipe, args=(conn, up), daemon=True).start()
            _pipe(up, conn)
        except OSError:
            try:
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self._lock:
            for s in self._conns:
                try:
                    s.close()
                except OSError:
                    pass
        self._thread.join(timeout=2)
        shutil.rmtree(self.dir, ignore_errors=True)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
