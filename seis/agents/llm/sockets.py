"""The host side of the unix sockets SEIS shows inside agent sandboxes (the dev benchmark, the API proxy)."""
from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Iterator

# accept() errors that pass: out of file descriptors or memory for a moment, or a peer gone before we took it.
TRANSIENT_ACCEPT_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED,
                                     errno.EPROTO})


def accept_until(sock: socket.socket, stop: threading.Event, backoff_s: float = 0.1) -> Iterator[socket.socket]:
    """Connections on `sock` (which has an accept timeout) until `stop` is set or the socket is closed.

    A transient accept error (e.g. EMFILE while a flood holds our descriptors) pauses `backoff_s` and goes on:
    giving up would leave the service dead for good. Any other error (EBADF, EINVAL: closed) ends it."""
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        except OSError as e:
            if e.errno in TRANSIENT_ACCEPT_ERRORS:
                stop.wait(backoff_s)  # the pending connection stays queued; retrying at once would only spin
                continue
            return
        yield conn
