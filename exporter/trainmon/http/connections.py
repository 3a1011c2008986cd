"""Where the HTTP server's connections wait: one selector thread, and the workers.

A connection whose request is still arriving costs a file descriptor and the
bytes it has sent, never a thread. ``Reception.serve`` (the server's
``serve_forever``) runs one thread over a ``selectors`` selector that holds
the listening socket and every connection waiting for its request:

1. **accept**, non-blocking. ``ConnectionLimits`` admits the connection under
   ``http.max_connections_per_client`` and ``http.max_connections``; at a full
   cap the connection that has waited longest for its request (of the same
   address at the per-client cap, of any at the global one) is closed to make
   room, and only when none is waiting (every slot answering or queued for an
   answer) does the newcomer get a 503. A request sent whole is dispatched
   within one turn of the loop, so it is never the longest-waiting: a flood of
   slow connections, from any number of addresses, churns only itself. If
   ``accept()`` fails for want of file descriptors (EMFILE, ENFILE) the
   listener is left alone for ``ACCEPT_BACKOFF_SECONDS``, not polled in a loop;
2. the **TLS handshake**, non-blocking (``do_handshake_on_connect=False``,
   ``SSLWantReadError``/``SSLWantWriteError`` choose the event to wait for);
3. the **request line and headers**, at most ``http.max_header_bytes`` (a
   longer head gets a 431), and then, where ``Content-Length`` announces one,
   the **body**: held in memory up to ``http.max_request_body_bytes`` (all
   bodies arriving at once at most ``http.max_buffered_body_bytes``: past it
   the one that began first is dropped with its connection), read and dropped
   up to ``MAX_DISCARDED_BODY_BYTES`` (the answer is a 413), left unread
   beyond (413 and a close; likewise a chunked body, 411);
4. the whole request goes to one of ``http.max_workers`` **worker** threads
   (started as requests find none idle: a node scraped now and then keeps one),
   which answers it (``answer``, the server's) with blocking writes under a
   deadline; a kept-alive connection comes back to the selector to wait for
   its next request, bytes already sent (pipelined) included.

Deadlines, counted from when the server starts waiting for a request (the
accept, the end of the handshake, or the end of the previous response), never
per-read timeouts: the head (and the handshake, and an idle keep-alive wait)
within ``http.header_timeout_seconds``, the whole request within
``http.read_timeout_seconds``. A connection whose deadline passes is closed
without an answer and counted in ``trainmon_http_request_timeouts_total``
(an idle keep-alive close is not a timeout).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import heapq
import itertools
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, cast

from trainmon.core.families import GaugeMetricFamily, Metric
from trainmon.http.framing import BodyState, framing_of, head_end
from trainmon.http.limits import CapReason, ConnectionLimits, client_key
from trainmon.http.listen import HTTPConfig
from trainmon.http.output import (
    Outgoing,
    OutputBudget,
    ResponseWriter,
    is_tls,
    read_would_block,
    tls_want_read,
    tls_want_write,
    would_block,
)

if TYPE_CHECKING:
    import ssl

    from trainmon.http.certificates import CertificateKeeper

log = logging.getLogger(__name__)

__all__ = ["MAX_DISCARDED_BODY_BYTES", "BodyState", "Connection", "Reception", "Request"]

#: A body over ``http.max_request_body_bytes`` but at most this long is read and
#: dropped before the 413 (a client that writes its whole body before it reads,
#: as urllib and requests do, then gets the answer); a longer one is not read.
MAX_DISCARDED_BODY_BYTES = 8 << 20
#: How long the listener is left alone after ``accept()`` ran out of file descriptors.
ACCEPT_BACKOFF_SECONDS = 0.1
#: Connections accepted per turn of the loop: between two turns every connection
#: with data is read, so a complete request waits behind at most this many accepts.
ACCEPT_BATCH = 32
#: Bytes asked of the kernel per read (a head's: at most what ``http.max_header_bytes``
#: leaves), and reads per connection per turn.
READ_BYTES = 64 << 10
READS_PER_TURN = 16

_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


class Phase(Enum):
    HANDSHAKE = "handshake"
    HEAD = "head"
    BODY = "body"
    QUEUED = "queued"
    SERVING = "serving"
    WRITING = "writing"
    CLOSED = "closed"


_WAITING = (Phase.HANDSHAKE, Phase.HEAD, Phase.BODY)
#: Phases under a deadline.
_TIMED = (*_WAITING, Phase.WRITING)


@dataclass(eq=False, repr=False)
class Connection:
    """One accepted connection. Its fields belong to the selector thread while it
    waits, and to one worker while it is answered."""

    sock: socket.socket
    #: The peer as ``accept()`` returned it, and the address its caps count against.
    address: tuple[str, int]
    client: str
    phase: Phase
    #: Bytes received and not yet part of a request handed to a worker.
    buffer: bytearray = field(default_factory=bytearray)
    #: Requests answered on this connection.
    requests: int = 0
    #: Bytes received since the current wait began (a head that has begun vs an idle wait).
    received: int = 0
    head_deadline: float = 0.0
    request_deadline: float = 0.0
    #: Identifies the current deadline among the selector's heap entries.
    deadline_entry: int = -1
    #: The request head's length, once complete; body bytes still to come.
    head_length: int = 0
    body_left: int = 0
    body_state: BodyState = "none"
    #: Body bytes this connection holds of ``http.max_buffered_body_bytes``.
    reserved: int = 0
    events: int = 0
    #: The answer's bytes the kernel has not taken yet, and whether the connection stays
    #: open once they are sent.
    outgoing: Outgoing = field(default_factory=Outgoing)
    keep_open: bool = False
    #: When its worker handed it back (``time.monotonic()``).
    answered_at: float = 0.0
    #: The local user of a loopback client, asked of the kernel once (``trainmon.http.peer``).
    peer_asked: bool = False
    peer_uid: int | None = None

    @property
    def tls(self) -> bool:
        return is_tls(self.sock)

    def __repr__(self) -> str:  # never the bytes a client sent: they reach the log
        return f"<connection from {self.client} ({self.phase.value})>"


@dataclass(frozen=True)
class Request:
    """A whole request, as a worker gets it: its connection, its bytes (request
    line, headers and, when ``body`` is ``read``, the body), its body's state, and
    where its answer is written."""

    connection: Connection
    data: bytes
    body: BodyState
    output: ResponseWriter


#: A worker's answer to one request: True keeps the connection open for the next one.
Answer = Callable[[Request], bool]


class Reception:
    """The selector thread and the worker pool of one listening socket (module docstring)."""

    def __init__(
        self,
        listener: socket.socket,
        limits: ConnectionLimits,
        http: HTTPConfig,
        answer: Answer,
        tls: CertificateKeeper | None = None,
    ) -> None:
        self._listener = listener
        self._limits = limits
        self._answer = answer
        self._tls = tls
        self._workers = http.max_workers
        self._header_timeout = min(http.header_timeout_seconds, http.read_timeout_seconds)
        self._read_timeout = http.read_timeout_seconds
        self._max_head = http.max_header_bytes
        self._max_body = http.max_request_body_bytes
        self._body_budget = max(http.max_buffered_body_bytes, http.max_request_body_bytes)
        self._output_budget = OutputBudget(http.max_buffered_response_bytes)
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        for end in (self._wake_reader, self._wake_writer):
            end.setblocking(False)
        self._queue: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        #: Connections in the order their current wait began: all, and per client.
        self._waiting: dict[Connection, None] = {}
        self._waiting_by_client: dict[str, dict[Connection, None]] = {}
        #: Connections whose body is arriving into memory, in the order they began.
        self._bodies: dict[Connection, None] = {}
        self._buffered_body_bytes = 0
        self._deadlines: list[tuple[float, int, Connection]] = []
        self._entries = itertools.count()
        #: TLS connections with decrypted bytes the selector cannot see.
        self._tls_pending: set[Connection] = set()
        self._listener_paused_until: float | None = None
        #: Kept-alive connections handed back by workers (under ``_lock``).
        self._returned: collections.deque[Connection] = collections.deque()
        #: Connections whose answer the selector is sending; workers answering.
        self._writing: set[Connection] = set()
        self._answering = 0
        #: Worker threads started (at most ``http.max_workers``) and those waiting for work.
        self._started_workers = 0
        self._idle_workers = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._started = False

    # -- the loop -----------------------------------------------------------------

    def serve(self, poll_interval: float = 0.5) -> None:
        """Accept and read until ``stop``; ``poll_interval`` bounds one wait (seconds)."""
        with self._lock:
            if self._stopping.is_set():
                return
            self._started = True
        try:
            self._listener.setblocking(False)
            self._selector.register(self._listener, selectors.EVENT_READ, self._listener)
            self._selector.register(self._wake_reader, selectors.EVENT_READ, self._wake_reader)
            while not self._stopping.is_set():
                ready = self._selector.select(self._wait_seconds(poll_interval))
                self._take_returned()  # first: a connection may be ready already
                for key, _ in ready:
                    self._guarded(self._on_event, key.data)
                for connection in list(self._tls_pending):
                    self._guarded(self._read, connection)
                self._expire(time.monotonic())
                self._resume_listener()
        finally:
            try:
                self._wind_down()
            finally:
                self._stopped.set()  # whatever failed: ``stop`` never waits for a dead loop

    def _on_event(self, ready: object) -> None:
        if ready is self._listener:
            self._accept()
        elif ready is self._wake_reader:
            with contextlib.suppress(BlockingIOError):
                while self._wake_reader.recv(4096):
                    pass
        elif isinstance(ready, Connection):
            if ready.phase is Phase.HANDSHAKE:
                self._handshake(ready)
            elif ready.phase in _WAITING:
                self._read(ready)
            elif ready.phase is Phase.WRITING:
                self._write(ready)
            # else: closed or handed to a worker earlier in this turn

    def _guarded(self, action: Callable[[Any], None], subject: object) -> None:
        """``action(subject)``; a failure (a bug) closes that connection and is logged,
        the loop and every other connection go on."""
        try:
            action(subject)
        except Exception:
            log.exception("the HTTP selector failed on %r", subject)
            if isinstance(subject, Connection):
                with contextlib.suppress(Exception):
                    self._close(subject)

    def stop(self) -> None:
        """End ``serve`` and wait for it (at once if it never started)."""
        with self._lock:
            self._stopping.set()
            started = self._started
        self._wake()
        if started:
            self._stopped.wait()

    def close(self) -> None:
        """Release the selector and the wake-up sockets (after ``stop``)."""
        self._selector.close()
        self._wake_reader.close()
        self._wake_writer.close()

    def _wait_seconds(self, poll_interval: float) -> float:
        if self._tls_pending:
            return 0.0
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] != deadlines[0][2].deadline_entry:
            heapq.heappop(deadlines)  # superseded (a request came): no reason to wake for it
        wake = deadlines[0][0] if deadlines else None
        if self._listener_paused_until is not None:
            wake = min(wake or self._listener_paused_until, self._listener_paused_until)
        if wake is None:
            return poll_interval
        return min(poll_interval, max(0.0, wake - time.monotonic()))

    def collect(self) -> list[Metric]:
        """``trainmon_http_connections{state}``: where the open connections are now."""
        with self._lock:
            answering = self._answering
        family = GaugeMetricFamily(
            "trainmon_http_connections",
            "Open HTTP connections by state: waiting (for their request, or its TLS "
            "handshake, head or body; the only ones closed to make room), queued (a whole "
            "request waiting for one of http.max_workers), answering (in a worker), "
            "writing (the answer queued while the client reads it).",
            labels=["state"],
        )
        for state, count in (("waiting", len(self._waiting)), ("queued", self._queue.qsize()),
                             ("answering", answering), ("writing", len(self._writing))):
            family.add_metric([state], float(count))
        return [family]

    def _wind_down(self) -> None:
        with self._lock:
            self._stopping.set()  # workers close what they finish from now on
            returned, self._returned = list(self._returned), collections.deque()
        for _ in range(self._workers):
            self._queue.put(None)  # after the queued requests: those are still answered
        for connection in [*self._waiting, *self._writing]:
            self._guarded(self._close, connection)
        for connection in returned:
            self._guarded(self._unwatch, connection)  # an idle one its worker registered
            self._guarded(self._finish, connection)
        for key in list(self._selector.get_map().values()):
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(key.fileobj)

    # -- accept ---------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE):
                    self._limits.refuse("", "fd_limit")
                    self._pause_listener()
                    return
                if error.errno in (errno.ENOBUFS, errno.ENOMEM):
                    self._pause_listener()
                    return
                continue  # the client gave up before we took it (ECONNABORTED...)
            self._admit(sock, (str(address[0]), int(address[1])))

    def _admit(self, sock: socket.socket, address: tuple[str, int]) -> None:
        host = address[0]
        client = client_key(host)
        while (cap := self._limits.admit(host)) is not None:
            waiting = self._longest_waiting(client if cap == "max_connections_per_client" else None)
            if waiting is None:
                self._limits.refuse(host, cap)
                _refuse(sock, cap, plaintext=self._tls is None)
                return
            self._limits.evict(waiting.address[0], cap)
            self._close(waiting)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.context().wrap_socket(sock, server_side=True,
                                                       do_handshake_on_connect=False)
        except (OSError, ValueError) as error:
            log.debug("cannot set up the connection from %s: %s", host, error)
            sock.close()
            self._limits.release(host)
            return
        connection = Connection(sock, address, client,
                                Phase.HANDSHAKE if self._tls is not None else Phase.HEAD)
        self._begin_wait(connection)
        self._watch(connection, selectors.EVENT_READ)

    def _longest_waiting(self, client: str | None) -> Connection | None:
        waiting = self._waiting if client is None else self._waiting_by_client.get(client)
        return next(iter(waiting), None) if waiting else None

    def _pause_listener(self) -> None:
        if self._listener_paused_until is None:
            self._selector.unregister(self._listener)
        self._listener_paused_until = time.monotonic() + ACCEPT_BACKOFF_SECONDS

    def _resume_listener(self) -> None:
        if self._listener_paused_until is not None and \
                time.monotonic() >= self._listener_paused_until:
            self._listener_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, self._listener)

    # -- reading a request ---------------------------------------------------------

    def _handshake(self, connection: Connection) -> None:
        try:
            cast("ssl.SSLSocket", connection.sock).do_handshake()
        except tls_want_read():
            self._watch(connection, selectors.EVENT_READ)
            return
        except tls_want_write():
            self._watch(connection, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as error:
            log.debug("TLS handshake with %s failed: %s", connection.address[0], error)
            self._close(connection)
            return
        connection.phase = Phase.HEAD
        self._restart_deadlines(connection)
        self._watch(connection, selectors.EVENT_READ)
        self._read(connection)

    def _read(self, connection: Connection) -> None:
        self._tls_pending.discard(connection)
        for _ in range(READS_PER_TURN):
            if connection.phase is Phase.HEAD:  # never more than a head over the limit
                wanted = max(1, min(READ_BYTES, self._max_head + 1 - len(connection.buffer)))
            else:
                wanted = min(READ_BYTES, connection.body_left)
            try:
                data = connection.sock.recv(wanted)
            except read_would_block():
                self._watch(connection, selectors.EVENT_READ)
                return
            except tls_want_write():
                self._watch(connection, selectors.EVENT_WRITE)
                return
            except (OSError, ValueError):
                self._close(connection)
                return
            if not data:  # the client closed its end
                self._close(connection)
                return
            connection.received += len(data)
            if connection.phase is Phase.BODY:
                connection.body_left -= len(data)
                if connection.body_state == "read":
                    connection.buffer += data
            else:
                connection.buffer += data
            self._advance(connection)
            if connection.phase not in _WAITING:
                return
            if not connection.tls and len(data) < wanted:
                break  # the kernel had no more: the selector says when there is
        self._watch(connection, selectors.EVENT_READ)
        if _tls_pending_bytes(connection.sock):
            self._tls_pending.add(connection)

    def _advance(self, connection: Connection) -> None:
        """Move a connection on after bytes arrived (or came back with it)."""
        if connection.phase is Phase.HEAD:
            end = head_end(connection.buffer)
            if end is None:
                if len(connection.buffer) > self._max_head:
                    self._reject_head(connection)
                return
            if end > self._max_head:
                self._reject_head(connection)
                return
            self._frame(connection, end)
        if connection.phase is Phase.BODY and connection.body_left == 0:
            # a body read into memory ends the buffer; a dropped one left only the head
            self._dispatch(connection, len(connection.buffer))

    def _frame(self, connection: Connection, head_end: int) -> None:
        """What follows a complete head: its body, read, dropped or left, then the worker."""
        framing = framing_of(bytes(connection.buffer[:head_end]))
        length = framing.length
        connection.head_length = head_end
        if length is None or length == 0:
            connection.body_state = "unread" if framing.unframed else "none"
            self._dispatch(connection, head_end)
            return
        if length > MAX_DISCARDED_BODY_BYTES:
            connection.body_state = "unread"
            self._dispatch(connection, head_end)
            return
        arrived = min(length, len(connection.buffer) - head_end)
        if length <= self._max_body:
            if arrived == length:
                connection.body_state = "read"
                self._dispatch(connection, head_end + length)
                return
            connection.body_state = "read"
            self._reserve(connection, length)
        else:
            connection.body_state = "discarded"
            del connection.buffer[head_end:head_end + arrived]
            if arrived == length:
                self._dispatch(connection, head_end)
                return
        connection.body_left = length - arrived
        connection.phase = Phase.BODY
        self._set_deadline(connection, connection.request_deadline)
        if framing.expects_continue:
            _send_quietly(connection.sock, _CONTINUE)

    def _reserve(self, connection: Connection, length: int) -> None:
        """Hold ``length`` bytes of the body budget, closing the bodies that began first
        while it is short."""
        while self._buffered_body_bytes + length > self._body_budget and self._bodies:
            oldest = next(iter(self._bodies))
            self._limits.evict(oldest.address[0], "max_buffered_body_bytes")
            self._close(oldest)
        connection.reserved = length
        self._buffered_body_bytes += length
        self._bodies[connection] = None

    def _reject_head(self, connection: Connection) -> None:
        self._limits.refuse(connection.address[0], "max_header_bytes")
        body = b"request head too long\n"
        with contextlib.suppress(OSError, ValueError):  # what already came: no reset on close
            connection.sock.recv(READ_BYTES)
        _send_quietly(connection.sock,
                      b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                      b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                      b"Connection: close\r\n\r\n%s" % (len(body), body))
        self._close(connection, graceful=True)

    def _dispatch(self, connection: Connection, end: int) -> None:
        """Hand the request (the first ``end`` bytes of the buffer) to a worker."""
        data = bytes(connection.buffer[:end])
        del connection.buffer[:end]
        self._leave_wait(connection)
        self._unwatch(connection)
        connection.phase = Phase.QUEUED
        output = ResponseWriter(connection.sock, connection.outgoing, self._output_budget,
                                self._read_timeout)
        self._queue.put(Request(connection, data, connection.body_state, output))
        self._staff()

    # -- waits and deadlines ------------------------------------------------------

    def _begin_wait(self, connection: Connection, since: float | None = None) -> None:
        """A wait for a request begins (at ``since``, else now): it goes to the back of the
        eviction order."""
        self._waiting[connection] = None
        self._waiting_by_client.setdefault(connection.client, {})[connection] = None
        self._restart_deadlines(connection, since)

    def _restart_deadlines(self, connection: Connection, since: float | None = None) -> None:
        now = time.monotonic() if since is None else since
        connection.received = 0
        connection.body_state = "none"
        connection.head_deadline = now + self._header_timeout
        connection.request_deadline = now + self._read_timeout
        self._set_deadline(connection, connection.head_deadline)

    def _set_deadline(self, connection: Connection, deadline: float) -> None:
        connection.deadline_entry = next(self._entries)
        heapq.heappush(self._deadlines, (deadline, connection.deadline_entry, connection))

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, entry, connection = heapq.heappop(self._deadlines)
            if entry != connection.deadline_entry or connection.phase not in _TIMED:
                continue  # an earlier deadline of this connection, or not waiting any more
            if connection.phase is Phase.WRITING:
                self._limits.count_timeout("response")
            elif connection.phase is Phase.HANDSHAKE:
                self._limits.count_timeout("handshake")
            elif connection.phase is Phase.BODY:
                self._limits.count_timeout("body")
            elif connection.received or connection.requests == 0:
                self._limits.count_timeout("head")
            # else: an idle keep-alive connection, closed as it should be
            self._close(connection)

    def _leave_wait(self, connection: Connection) -> None:
        self._waiting.pop(connection, None)
        mine = self._waiting_by_client.get(connection.client)
        if mine is not None:
            mine.pop(connection, None)
            if not mine:
                del self._waiting_by_client[connection.client]
        if connection in self._bodies:
            del self._bodies[connection]
            self._buffered_body_bytes -= connection.reserved
            connection.reserved = 0
        connection.deadline_entry = -1
        self._tls_pending.discard(connection)

    def _watch(self, connection: Connection, events: int) -> None:
        # Workers register idle kept-alive connections too (``_hand_back``): the selector
        # keeps its registrations in a dict, one entry per descriptor, and each dict
        # operation is atomic in CPython, so registrations of different connections from
        # two threads cannot interfere.
        if connection.events == events:
            return
        if connection.events:
            self._selector.modify(connection.sock, events, connection)
        else:
            self._selector.register(connection.sock, events, connection)
        connection.events = events

    def _unwatch(self, connection: Connection) -> None:
        if connection.events:
            self._selector.unregister(connection.sock)
            connection.events = 0

    def _close(self, connection: Connection, graceful: bool = False) -> None:
        """Close a connection the selector holds (waiting, writing, or just handed back);
        ``graceful``: after an answer, with a FIN before the close."""
        if connection.phase is Phase.CLOSED:
            return
        self._leave_wait(connection)
        self._unwatch(connection)
        self._writing.discard(connection)
        connection.outgoing.drop(self._output_budget)
        connection.phase = Phase.CLOSED
        if graceful:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_WR)
        connection.sock.close()
        self._limits.release(connection.address[0])

    # -- writing an answer --------------------------------------------------------------

    def _write(self, connection: Connection) -> None:
        """Send what the client takes of a queued answer; then wait for its next request,
        or close."""
        try:
            connection.outgoing.send(connection.sock, self._output_budget)
        except tls_want_read():
            self._watch(connection, selectors.EVENT_READ)
            return
        except would_block():
            self._watch(connection, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError):
            self._close(connection)
            return
        self._writing.discard(connection)
        if not connection.keep_open:
            self._close(connection, graceful=True)
            return
        self._await_next_request(connection, time.monotonic())

    # -- workers ----------------------------------------------------------------------

    def _staff(self) -> None:
        """Start a worker for a request just queued when none is idle, up to
        ``http.max_workers``: a node scraped once in a while keeps one worker thread
        (each costs its stack and its malloc arena in resident memory)."""
        with self._lock:
            if self._idle_workers > 0 or self._started_workers >= self._workers:
                return
            self._started_workers += 1
            self._idle_workers += 1  # counted idle until its first get
            number = self._started_workers - 1
        threading.Thread(target=self._work, name=f"http-worker-{number}", daemon=True).start()

    def _work(self) -> None:
        while True:
            request = self._queue.get()
            with self._lock:
                self._idle_workers -= 1
            if request is None:
                return
            self._answer_one(request)
            with self._lock:
                self._idle_workers += 1

    def _answer_one(self, request: Request) -> None:
        """Answer one whole request in this worker; the connection goes back to the
        selector thread (kept alive, or an answer still being sent) or is closed."""
        connection = request.connection
        connection.phase = Phase.SERVING
        with self._lock:
            self._answering += 1
        try:
            keep = self._answer(request)
        except Exception:  # a handler bug must not take the worker with it
            log.exception("answering %s failed", connection.address[0])
            keep = False
        with self._lock:
            self._answering -= 1
        connection.requests += 1
        connection.keep_open = keep
        if keep or connection.outgoing.queued:
            self._hand_back(connection)
        else:
            self._finish(connection)

    def _hand_back(self, connection: Connection) -> None:
        """Give an answered connection back to the selector thread. An idle kept-alive one
        (nothing left to send, nothing received ahead) is registered for its next request
        here, so the selector thread need not wake for it: it takes the connection over at
        its next turn, before it handles any event (the idle deadline counts from now)."""
        idle = not (connection.outgoing.queued or connection.buffer
                    or _tls_pending_bytes(connection.sock))
        with self._lock:
            taken = not self._stopping.is_set()
            if taken:
                connection.answered_at = time.monotonic()
                self._returned.append(connection)
                if idle:
                    connection.phase = Phase.HEAD
                    self._selector.register(connection.sock, selectors.EVENT_READ, connection)
                    connection.events = selectors.EVENT_READ
        if not taken:
            self._finish(connection)
        elif not idle:
            self._wake()

    def _finish(self, connection: Connection) -> None:
        """Close a connection after its last answer (in a worker, or at the end)."""
        connection.phase = Phase.CLOSED
        connection.outgoing.drop(self._output_budget)
        with contextlib.suppress(OSError):
            connection.sock.shutdown(socket.SHUT_WR)  # the answer ends with a FIN, not a reset
        connection.sock.close()
        self._limits.release(connection.address[0])

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is already pending
            self._wake_writer.send(b"\0")

    def _take_returned(self) -> None:
        """Take over the connections workers handed back (``_hand_back``)."""
        if not self._returned:  # most turns: no lock needed to see that
            return
        with self._lock:
            returned, self._returned = list(self._returned), collections.deque()
        for connection in returned:
            if connection.phase is not Phase.CLOSED:  # closed meanwhile: to make room
                self._guarded(self._take_back, connection)

    def _take_back(self, connection: Connection) -> None:
        if connection.outgoing.queued:  # the client has yet to take the whole answer
            connection.phase = Phase.WRITING
            self._writing.add(connection)
            self._set_deadline(connection, connection.answered_at + self._read_timeout)
            self._write(connection)
        else:
            self._await_next_request(connection, connection.answered_at)

    def _await_next_request(self, connection: Connection, since: float) -> None:
        """A kept-alive connection, answered (at ``since``): back to waiting, bytes it sent
        ahead included."""
        connection.phase = Phase.HEAD
        self._begin_wait(connection, since)
        self._watch(connection, selectors.EVENT_READ)
        if connection.buffer:  # a pipelined request came with the last one
            connection.received = len(connection.buffer)
            self._advance(connection)
        if connection.phase is Phase.HEAD and _tls_pending_bytes(connection.sock):
            self._tls_pending.add(connection)


_REFUSAL_BODIES: dict[CapReason, bytes] = {
    "max_connections": b"too many connections\n",
    "max_connections_per_client": b"too many connections from your address\n",
}


def _refuse(sock: socket.socket, reason: CapReason, plaintext: bool) -> None:
    """Answer 503 without reading the request, then close: ``reason`` is the cap reached."""
    body = _REFUSAL_BODIES[reason]
    sock.setblocking(False)
    if plaintext:
        with contextlib.suppress(OSError):
            sock.recv(READ_BYTES)  # what already came, so that the close sends no reset
        _send_quietly(
            sock,
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s"
            % (len(body), body))
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
    sock.close()


def _tls_pending_bytes(sock: socket.socket) -> int:
    """Decrypted bytes a TLS socket holds that the selector cannot see (0 without TLS)."""
    return cast("ssl.SSLSocket", sock).pending() if is_tls(sock) else 0


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    """One non-blocking send of a short answer; a client that cannot take it loses it."""
    with contextlib.suppress(OSError, ValueError):
        sock.send(data)
