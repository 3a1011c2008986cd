"""An answer on its way to the client: sent as far as the kernel takes it, the rest queued.

A worker writes a response through ``ResponseWriter``. Each write goes out at
once, non-blocking, as far as the socket's send buffer takes it; what is left
is queued on the connection (``Outgoing``), and once the worker is done the
selector thread (``trainmon.http.connections``) sends it as the client reads,
within ``http.read_timeout_seconds``. A client that reads its answer slowly,
or not at all, so holds a file descriptor and its queued bytes, not a worker.

The bytes queued on all connections together are bounded by
``http.max_buffered_response_bytes`` (``OutputBudget``). An answer that would
go past it is written by its worker itself, blocking, each write within
``http.read_timeout_seconds``, as every answer was before the selector; a
write that runs out of time marks the writer ``stalled`` (the connection is
then closed and counted as a ``response`` timeout).

Bytes go out in pieces of ``SEND_BYTES`` from the same offsets whoever sends
them: after ``SSLWantWriteError`` OpenSSL must be given the same bytes again.
"""

from __future__ import annotations

import collections
import io
import socket
import sys
import threading
import time
from typing import Any

__all__ = ["SEND_BYTES", "Outgoing", "OutputBudget", "ResponseWriter", "is_tls",
           "read_would_block", "tls_want_read", "tls_want_write", "would_block"]

#: Bytes handed to one ``send``.
SEND_BYTES = 64 << 10


# ``ssl`` is loaded with a TLS web config only (libssl and libcrypto: 4 MiB resident);
# before, no TLS socket exists, and none of its errors can be raised.

def tls_want_read() -> tuple[type[OSError], ...]:
    """A TLS socket's refusal to go on before it can read (none without ``ssl``)."""
    tls = sys.modules.get("ssl")
    return (tls.SSLWantReadError,) if tls is not None else ()


def tls_want_write() -> tuple[type[OSError], ...]:
    """A TLS socket's refusal to go on before it can write (none without ``ssl``)."""
    tls = sys.modules.get("ssl")
    return (tls.SSLWantWriteError,) if tls is not None else ()


def would_block() -> tuple[type[OSError], ...]:
    """What a non-blocking send raises when the socket takes nothing now."""
    return (BlockingIOError, *tls_want_write(), *tls_want_read())


def read_would_block() -> tuple[type[OSError], ...]:
    """What a non-blocking receive raises when there is nothing to read now."""
    return (BlockingIOError, *tls_want_read())


def is_tls(sock: socket.socket) -> bool:
    tls = sys.modules.get("ssl")
    return tls is not None and isinstance(sock, tls.SSLSocket)


class OutputBudget:
    """Bytes queued for clients, all connections together, at most ``limit``. Thread-safe:
    workers take, the selector thread gives back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        with self._lock:
            return self._used

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes if they fit."""
        with self._lock:
            if self._used + size > self.limit:
                return False
            self._used += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self._used -= size


class Outgoing:
    """The bytes of a connection's answer that the kernel has not taken yet.

    Written by the worker answering, then sent by the selector thread: never by
    both at once."""

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._offset = 0
        #: Bytes queued and not yet sent.
        self.queued = 0

    def append(self, data: bytes) -> None:
        self._chunks.append(data)
        self.queued += len(data)

    def send(self, sock: socket.socket, budget: OutputBudget) -> bool:
        """Send what ``sock`` takes now (giving the bytes sent back to ``budget``): True
        once everything is sent. A socket that takes nothing raises one of
        ``would_block()``; a gone client, its ``OSError``."""
        while self._chunks:
            self.send_piece(sock, budget)
        return True

    def send_piece(self, sock: socket.socket, budget: OutputBudget) -> None:
        """One ``send`` of at most ``SEND_BYTES`` of the first queued chunk."""
        chunk = self._chunks[0]
        sent = sock.send(memoryview(chunk)[self._offset:self._offset + SEND_BYTES])
        self._offset += sent
        self.queued -= sent
        budget.give(sent)
        if self._offset == len(chunk):
            self._chunks.popleft()
            self._offset = 0

    def drop(self, budget: OutputBudget) -> None:
        """Forget what is queued (the connection is closing)."""
        budget.give(self.queued)
        self._chunks.clear()
        self._offset = self.queued = 0


class ResponseWriter(io.BufferedIOBase):
    """A worker's writes of one answer (the module docstring says where they go)."""

    def __init__(self, sock: socket.socket, outgoing: Outgoing, budget: OutputBudget,
                 seconds: float) -> None:
        self._sock = sock
        self._outgoing = outgoing
        self._budget = budget
        self._seconds = seconds
        self._blocking = False
        self.stalled = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if not self._blocking:
            if not self._outgoing.queued:
                view = view[self._send_now(view):]
                if not view:
                    return size
            if self._budget.take(len(view)):
                self._outgoing.append(bytes(view))
                return size
            self._blocking = True  # past the budget: the rest of this answer from here
        self._send_blocking(view)
        return size

    def _send_now(self, view: memoryview) -> int:
        sent = 0
        while sent < len(view):
            try:
                sent += self._sock.send(view[sent:sent + SEND_BYTES])
            except would_block():
                break
        return sent

    def _send_blocking(self, view: memoryview) -> None:
        """What is queued, then ``view``, each within the deadline; the socket is left
        non-blocking, as the selector thread keeps it."""
        deadline = time.monotonic() + self._seconds
        try:
            while self._outgoing.queued:
                self._sock.settimeout(self._remaining(deadline))
                self._outgoing.send_piece(self._sock, self._budget)
            sent = 0
            while sent < len(view):
                self._sock.settimeout(self._remaining(deadline))
                sent += self._sock.send(view[sent:sent + SEND_BYTES])
        except TimeoutError:
            self.stalled = True
            raise
        finally:
            self._sock.setblocking(False)

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self.stalled = True
            raise TimeoutError("response write deadline exceeded")
        return remaining
