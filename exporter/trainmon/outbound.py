"""Outbound HTTP with a total deadline: every request trainmon makes. Standard library only.

``request(method, url, timeout=...)`` bounds the **whole** request — name
lookup, connect, TLS handshake, sending, the status line, the headers and the
body — by one deadline, ``timeout`` seconds after the call. Every socket
operation gets the time left as its own timeout, and once the deadline has
passed the request fails with ``OutboundError("timeout")``, however slowly the
server trickles bytes. (A per-read timeout, as ``requests`` and a plain
``http.client`` connection have, restarts with every byte: a server sending one
byte every half second holds a 1 s-timeout request for as long as it likes.)
The body is read up to ``max_body_bytes``; a longer one is
``OutboundError("too_large")`` and is not read further.

Users: the CVM metadata client (``tencent.metadata``: the platform poller's
and the CAM role credentials' reads), the Tencent Cloud API client
(``tencent.client``), the kubelet pod list (``attribution.kubelet``) and the
training client's HTTP delivery (``client.transport``), which is why this
module imports nothing outside the standard library.

A forward proxy is used only when the caller passes one (``proxy``; the
Tencent Cloud API client passes ``environment_proxy(url)``, the
``HTTPS_PROXY``/``NO_PROXY`` rule ``requests`` applied): ``https`` through a
``CONNECT`` tunnel, ``http`` in absolute form; the metadata service and the
kubelet are never reached through one. What it does not do, on purpose:
follow redirects, keep connections alive between requests (one connection per
request, closed at the end), or decode ``Content-Encoding``. Name lookup runs
on a short-lived daemon thread when the host is not an IP literal, because
``getaddrinfo`` takes no timeout; a lookup that outlives the deadline is
abandoned to that thread.

``OutboundError.reason`` is one of ``timeout``, ``unreachable`` (name lookup,
connect, reset, TLS), ``protocol`` (not HTTP: a bad status line, too many
headers, a cut-off body) and ``too_large``; callers map it to their own
counters' labels.
"""

from __future__ import annotations

import io
import ipaddress
import select
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:  # imported where used: http.client loads ssl and email (4 MiB resident)
    import http.client
    import ssl

OutboundReason = Literal["timeout", "unreachable", "protocol", "too_large"]

#: Default cap on a response body, bytes.
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Bytes read per body read call (each call gets the time left).
_READ_CHUNK_BYTES = 64 * 1024


class OutboundError(Exception):
    """One request failed; ``reason`` says how (see the module docstring)."""

    def __init__(self, reason: OutboundReason, message: str) -> None:
        super().__init__(message)
        self.reason: OutboundReason = reason


class _DeadlinePassed(TimeoutError):
    """Raised inside a request when its deadline has passed."""


@dataclass(frozen=True)
class Response:
    """A complete answer: status, reason phrase, headers (lower-case names), body."""

    status: int
    reason: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str, default: str | None = None) -> str | None:
        """The value of header ``name`` (any case), else ``default``."""
        return self.headers.get(name.lower(), default)


class Fetch(Protocol):
    """The signature of ``request``: what the clients take as their HTTP boundary."""

    def __call__(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        proxy: str | None = None,
    ) -> Response: ...


class Deadline:
    """A point in ``time.monotonic()`` seconds; ``left()`` raises once it has passed."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._at = clock() + seconds

    def left(self) -> float:
        """Seconds left (> 0); raises ``TimeoutError`` when none are."""
        remaining = self._at - self._clock()
        if remaining <= 0:
            raise _DeadlinePassed(f"no complete answer within {self.seconds:g} s")
        return remaining


def request(
    method: str,
    url: str,
    *,
    timeout: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ssl_context: ssl.SSLContext | None = None,
    proxy: str | None = None,
) -> Response:
    """``method url`` answered completely within ``timeout`` seconds, or ``OutboundError``.

    ``url`` is ``http://`` or ``https://`` (``ssl_context`` for the latter:
    default, the system's CA store with host name checks); ``proxy`` an
    ``http://host:port`` forward proxy, the deadline covering it too. Any
    status is a ``Response``; only a missing or unreadable answer raises.
    """
    parts = urllib.parse.urlsplit(url)
    host, port = _host_port(parts, url)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    deadline = Deadline(timeout)
    context = None
    if parts.scheme == "https":
        import ssl

        context = ssl_context or ssl.create_default_context()
    via: tuple[str, int] | None = None
    if proxy:
        via = _host_port(urllib.parse.urlsplit(proxy), proxy, scheme="http")
        if context is None:  # plain HTTP through a proxy: the absolute URI
            target = urllib.parse.urlunsplit(("http", parts.netloc, target, "", ""))
    try:
        raw = _open(host, port, deadline, context, via)
    except OSError as error:  # a timeout too: TimeoutError is one
        raise _failure(error, host, port, timeout) from None
    # here, once connected: a node whose metadata service does not resolve never loads it
    import http.client

    connection = http.client.HTTPConnection(host, port, timeout=deadline.seconds)
    connection.sock = _DeadlineSocket(raw, deadline)  # connected: http.client will not connect
    answer: http.client.HTTPResponse | None = None
    try:
        connection.request(method, target, body=body, headers=dict(headers or {}))
        answer = connection.getresponse()
        content = _read_body(answer, max_body_bytes)
        return Response(
            answer.status,
            answer.reason,
            {name.lower(): value for name, value in answer.getheaders()},
            content,
        )
    except http.client.HTTPException as error:
        raise OutboundError(
            "protocol", f"{host}:{port}: not an HTTP answer ({type(error).__name__})"
        ) from None
    except OSError as error:
        raise _failure(error, host, port, timeout) from None
    finally:
        if answer is not None:
            answer.close()
        connection.close()


def _failure(error: OSError, host: str, port: int, timeout: float) -> OutboundError:
    """A socket's failure as the request's: a timeout (the time left ran out on a socket
    call, or the deadline itself), else ``unreachable`` (refused, reset, unresolvable,
    TLS: ``ssl.SSLError`` is an ``OSError``)."""
    if isinstance(error, TimeoutError):
        return OutboundError("timeout", f"{host}:{port}: no complete answer within {timeout:g} s")
    return OutboundError("unreachable", f"{host}:{port}: {_describe(error)}")


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``,
    lower-case too), unless ``NO_PROXY`` exempts its host; else None."""
    import urllib.request  # here: the Tencent API client's only (it loads http.client)

    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme)
    if not proxy or not parts.hostname:
        return None
    if urllib.request.proxy_bypass(parts.hostname):  # NO_PROXY, on Linux
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _host_port(
    parts: urllib.parse.SplitResult, url: str, scheme: str | None = None
) -> tuple[str, int]:
    """Host and port of an ``http(s)`` URL (``scheme``: the one it must have)."""
    allowed = (scheme,) if scheme else ("http", "https")
    if parts.scheme not in allowed or not parts.hostname:
        raise OutboundError("unreachable", f"not an {'/'.join(allowed)} URL: {url[:80]!r}")
    try:
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise OutboundError("unreachable", f"invalid port in {url[:80]!r}") from None


def _read_body(answer: http.client.HTTPResponse, limit: int) -> bytes:
    """The body, at most ``limit`` bytes; more is ``OutboundError("too_large")``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = answer.read(min(_READ_CHUNK_BYTES, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise OutboundError("too_large", f"answer body over {limit} bytes")


def _describe(error: OSError) -> str:
    return f"{type(error).__name__}: {error.strerror or error}"


def _open(host: str, port: int, deadline: Deadline, context: ssl.SSLContext | None,
          proxy: tuple[str, int] | None) -> socket.socket:
    """The connection a request goes over: TCP to ``host`` (or to ``proxy``, then a
    ``CONNECT`` tunnel for TLS), and the TLS handshake with ``context``."""
    raw = _connect(*(proxy or (host, port)), deadline)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            if proxy is not None:
                _tunnel(raw, host, port, deadline)
            raw = _handshake(context, raw, host, deadline)
    except BaseException:
        raw.close()
        raise
    return raw


def _connect(host: str, port: int, deadline: Deadline) -> socket.socket:
    """A TCP connection to the first address of ``host`` that accepts, within the deadline."""
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in _resolve(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
            return sock
        except TimeoutError:
            sock.close()
            raise
        except OSError as failed:
            sock.close()
            error = failed
    raise error


_Address = tuple[int, int, int, str, tuple[str, int] | tuple[str, int, int, int]]


def _resolve(host: str, port: int, deadline: Deadline) -> list[_Address]:
    """``getaddrinfo`` bounded by the deadline (on a daemon thread unless ``host`` is an IP).

    An ASCII name is passed as bytes: ``getaddrinfo`` would otherwise run it through
    the ``idna`` codec, whose import (``stringprep``, ``unicodedata``) stays resident."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))  # type: ignore[arg-type]
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    found: list[_Address] = []
    failure: list[OSError] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(name, port, type=socket.SOCK_STREAM))  # type: ignore[arg-type]
        except OSError as error:
            failure.append(error)
        finally:
            done.set()

    threading.Thread(target=lookup, name="trainmon-resolve", daemon=True).start()
    if not done.wait(deadline.left()):
        raise _DeadlinePassed(f"name lookup of {host} took over {deadline.seconds:g} s")
    if failure:
        raise failure[0]
    return found


def _tunnel(raw: socket.socket, host: str, port: int, deadline: Deadline) -> None:
    """Ask the proxy on ``raw`` for a tunnel to ``host:port`` (``CONNECT``)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    import http.client

    proxy = _DeadlineSocket(raw, deadline)
    proxy.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    answer = http.client.HTTPResponse(proxy, method="CONNECT")  # type: ignore[arg-type]
    answer.begin()  # status line and headers; a tunnel has no body
    if answer.status != 200:
        raise OSError(f"the proxy refused the tunnel to {authority}: HTTP {answer.status}")


def _handshake(
    context: ssl.SSLContext, raw: socket.socket, host: str, deadline: Deadline
) -> ssl.SSLSocket:
    """The TLS handshake, non-blocking, each wait at most the time left."""
    import ssl

    wrapped = context.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False)
    try:  # ``raw`` is detached now: ``wrapped`` owns the file descriptor
        wrapped.setblocking(False)
        while True:
            try:
                wrapped.do_handshake()
                break
            except ssl.SSLWantReadError:
                select.select([wrapped], [], [], deadline.left())
            except ssl.SSLWantWriteError:
                select.select([], [wrapped], [], deadline.left())
        wrapped.setblocking(True)
    except BaseException:
        wrapped.close()
        raise
    return wrapped


class _DeadlineSocket:
    """The socket ``http.client`` sees: sends and reads get the time left as timeout.

    A blocking socket with a timeout applies it to each call, so the deadline
    is re-applied before every ``send`` and every ``recv_into``; when it has
    passed, the call raises ``TimeoutError`` without touching the socket. As
    with a real socket, ``close()`` waits for the files ``makefile()`` gave
    out: ``http.client`` closes the connection of a ``Connection: close``
    answer before its body is read.
    """

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self._sock = sock
        self._deadline = deadline
        self._files = 0
        self._closed = False

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._sock.settimeout(self._deadline.left())
            sent = self._sock.send(view)
            view = view[sent:]

    def recv_into(self, buffer: memoryview | bytearray, size: int = 0) -> int:
        self._sock.settimeout(self._deadline.left())
        return self._sock.recv_into(buffer, size)

    def makefile(self, mode: str = "rb", buffering: int = -1) -> io.BufferedReader:
        self._files += 1
        return io.BufferedReader(_DeadlineReader(self))

    def setsockopt(self, *args: object) -> None:
        pass  # options were set on the raw socket in connect()

    def file_closed(self) -> None:
        """One file of ``makefile()`` was closed."""
        self._files -= 1
        if self._closed and self._files <= 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._files <= 0:
            self._sock.close()


class _DeadlineReader(io.RawIOBase):
    """The raw stream under ``HTTPResponse.fp``: every read is bounded by the deadline."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.file_closed()
        super().close()
