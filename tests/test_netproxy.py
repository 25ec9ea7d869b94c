"""The API proxy (seis/agents/llm/netproxy.py) against a hostile client on its unix socket: a flood of held
connections, running out of descriptors, a slow request head, a silent tunnel. Real sockets only (the proxy's unix
socket and 127.0.0.1); the proxy runs in this process, so its threads and descriptors are ours to count.
CPU only; a few seconds each."""
from __future__ import annotations

import errno
import os
import resource
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from seis.agents.llm.netproxy import OVERLOADED, ApiProxy

FLOOD = 2000
NOT_ALLOWED = b"CONNECT not-allowed.example:443 HTTP/1.1\r\nHost: not-allowed.example:443\r\n\r\n"


@pytest.fixture
def proxies() -> Iterator[Callable[..., ApiProxy]]:
    """Makes ApiProxy objects and closes them after the test."""
    made: list[ApiProxy] = []

    def make(*args, **kwargs) -> ApiProxy:
        made.append(ApiProxy(*args, **kwargs))
        return made[-1]
    yield make
    for p in made:
        p.close()


def _connect(proxy: ApiProxy, timeout: float = 5.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    end = time.monotonic() + timeout
    while True:
        try:
            s.connect(proxy.sock_path)
            return s
        except BlockingIOError:  # the listen backlog is full (a unix socket with a timeout does not wait)
            if time.monotonic() > end:
                s.close()
                raise
            time.sleep(0.01)


def _read_all(s: socket.socket) -> bytes:
    """Everything until the proxy closes (a reset after its reply counts as closed: it may not read all we sent)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def _ask(proxy: ApiProxy, request: bytes = NOT_ALLOWED) -> bytes:
    with _connect(proxy) as s:
        try:
            s.sendall(request)
        except (BrokenPipeError, ConnectionResetError):  # turned away (503) and closed before it was sent: the
            pass                                          # reply is still there to read
        return _read_all(s)


def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_a_flood_of_held_connections_is_capped_and_the_proxy_recovers(proxies):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FLOOD * 2 + 256  # our client ends and the proxy's accepted ends live in this one process
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    proxy = proxies(["api.example.com:443"], head_timeout_s=60)  # the flood is held by the cap, not the deadline
    threads_before = threading.active_count()
    flood: list[socket.socket] = []
    try:
        for i in range(FLOOD):
            flood.append(_connect(proxy))
            if i % 2:
                try:
                    flood[-1].send(b"CONNECT api.exa")  # a partial head, never finished
                except OSError:  # turned away (503) and closed by the proxy already
                    pass
        # Accepts are in order, so this answer also means every flood connection was taken or turned away.
        t0 = time.monotonic()
        reply = _ask(proxy)
        assert time.monotonic() - t0 < 3, "the proxy did not answer promptly under the flood"
        assert reply.startswith((b"HTTP/1.1 503 ", b"HTTP/1.1 403 ")), reply
        assert threading.active_count() - threads_before <= proxy.max_conns + 3
        assert _read_all(flood[-2]) == OVERLOADED  # one turned away: told at once, and closed
        assert proxy.active == proxy.max_conns and proxy.overloaded >= FLOOD - proxy.max_conns
    finally:
        for s in flood:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # Closed by the client, each held connection gives its slot back; the proxy serves again.
    assert _wait(lambda: proxy.active == 0), proxy.active
    assert _ask(proxy).startswith(b"HTTP/1.1 403 Forbidden")
    assert _wait(lambda: not proxy._conns), "closed sockets are still tracked"
    assert _wait(lambda: threading.active_count() <= threads_before)


def test_accept_survives_running_out_of_descriptors(proxies):
    proxy = proxies(["api.example.com:443"])
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # made now: connecting needs no new descriptor
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    try:
        # No descriptor left in this process: the proxy's accept() fails with EMFILE while this lasts.
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 1, limits[1]))
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))  # fills any lower holes
            except OSError as e:
                assert e.errno == errno.EMFILE
                break
        client.settimeout(5)
        client.connect(proxy.sock_path)  # queued in the listen backlog
        client.sendall(NOT_ALLOWED)
        client.settimeout(1.0)
        with pytest.raises(TimeoutError):
            client.recv(100)  # not accepted: there is no descriptor to take it with
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    client.settimeout(5)
    with client:
        assert _read_all(client).startswith(b"HTTP/1.1 403 Forbidden"), "the proxy stopped accepting for good"
    assert _ask(proxy).startswith(b"HTTP/1.1 403 Forbidden")
    assert proxy.refused == ["CONNECT not-allowed.example:443"] * 2


def test_a_slow_request_head_is_cut_at_the_deadline(proxies):
    proxy = proxies(["api.example.com:443"], head_timeout_s=1.0)
    with _connect(proxy) as s:
        # One byte every 0.2 s: each recv is quick, but the whole head (about 15 s at this pace) never arrives.
        t0, reply = time.monotonic(), None
        for byte in NOT_ALLOWED:
            if time.monotonic() - t0 > 6:
                break
            try:
                s.send(bytes([byte]))
            except OSError:  # the proxy closed it; the reply (if any) is read below
                pass
            if select.select([s], [], [], 0.2)[0]:
                reply = _read_all(s)
                break
        elapsed = time.monotonic() - t0
    assert reply is not None, "a trickled head held its connection past the deadline"
    assert reply == b"" or reply.startswith(b"HTTP/1.1 408 "), reply
    assert elapsed < 1.0 + 1.5, elapsed
    assert _wait(lambda: proxy.active == 0 and not proxy._conns)
    assert proxy.refused == [] and proxy.passed == []


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello {self.path} {self.headers.get('Connection')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_an_allowed_http_endpoint_works_and_a_silent_tunnel_is_closed(proxies):
    http = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    port = http.server_address[1]
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(5)
    silent_port = silent.getsockname()[1]
    proxy = proxies([f"http://127.0.0.1:{port}", f"127.0.0.1:{silent_port}"], idle_timeout_s=1.0)
    try:
        # plain HTTP, absolute form, end to end (the proxy asks for Connection: close upstream)
        reply = _ask(proxy, f"GET http://127.0.0.1:{port}/v1/models?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                            "Proxy-Connection: keep-alive\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.0 200 ") and reply.endswith(b"hello /v1/models?x=1 close"), reply

        # a tunnel: data one way keeps it open past the idle timeout; then silence closes both ends
        with _connect(proxy) as c:
            c.sendall(f"CONNECT 127.0.0.1:{silent_port} HTTP/1.1\r\n\r\n".encode())
            assert c.recv(100) == b"HTTP/1.1 200 Connection established\r\n\r\n"
            up, _ = silent.accept()
            with up:
                for _ in range(4):  # 2 s of a slow stream from upstream, the client silent
                    time.sleep(0.5)
                    up.sendall(b"x")
                    assert c.recv(16) == b"x"
                t0 = time.monotonic()
                assert _read_all(c) == b""
                assert 0.7 < time.monotonic() - t0 < 1.0 + 1.5
                up.settimeout(3)
                assert up.recv(16) == b"", "the upstream end was left open"
        assert _wait(lambda: proxy.active == 0 and not proxy._conns)
        assert proxy.passed == [f"GET 127.0.0.1:{port}", f"CONNECT 127.0.0.1:{silent_port}"]
    finally:
        http.shutdown()
        http.server_close()
        silent.close()


@pytest.mark.parametrize("target", ["http://api.example.com:xyz/v1", "http://[::1/v1", "http://api.example.com:99999/"])
def test_a_malformed_absolute_url_is_refused_and_raises_nothing_in_the_proxy(proxies, monkeypatch, target):
    """An absolute-form target whose port is no number or out of range, or whose [IPv6] literal is broken, raised
    ValueError out of the proxy's handler thread: the client got no answer, the refusal was not counted, and every
    such request printed a traceback on the orchestrator's stderr (a log an agent could fill at thousands of
    requests a second). It is refused like any endpoint not allowed."""
    escaped: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    proxy = proxies(["api.example.com:443"])
    reply = _ask(proxy, f"GET {target} HTTP/1.1\r\nHost: api.example.com\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 403 "), reply
    assert _wait(lambda: proxy.active == 0) and not escaped, escaped
    assert proxy.refused == [f"GET {target}"] and proxy.passed == []
