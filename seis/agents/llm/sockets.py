"""The host side of the unix sockets SEIS shows inside agent sandboxes (the dev benchmark, the API proxy)."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator


def accept_until(sock: socket.socket, stop: threading.Event) -> Iterator[socket.socket]:
    """Connections on `sock` (which has an accept timeout) until `stop` is set or the socket is closed."""
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except (TimeoutError, socket.timeout):
            continue
        except OSError:
            return
        yield conn
