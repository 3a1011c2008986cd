"""Where the HTTP server listens and how long it waits: the ``listen`` key and the ``http`` section.

``parse_listen_address`` reads ``listen`` (and ``--listen``, ``$TRAINMON_LISTEN``);
``HTTPConfig`` is the ``http`` section, read by ``trainmon.section.read_section``
with the bounds of its fields. ``trainmon.http.server`` documents the connection
model these limits bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainmon.section import Invalid, setting

DEFAULT_LISTEN = "0.0.0.0:19400"


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen_address(text: str) -> ListenAddress:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces)."""
    match = re.fullmatch(
        r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", text
    )
    if match is None:
        raise ValueError(f"expected host:port, [ipv6]:port or :port, got {text!r}")
    port = int(match.group("port"))
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0-65535, got {port}")
    host = match.group("v6") or match.group("host") or "0.0.0.0"
    return ListenAddress(host, port)


@dataclass(frozen=True)
class HTTPConfig:
    """Limits that keep a slow or hostile client from stalling scrapes.

    A connection whose request is still arriving costs a file descriptor and its
    buffered bytes, never a thread: ``trainmon.http.connections`` documents the
    model (one selector thread reads every request, ``max_workers`` threads
    answer whole ones). Connections are counted while open; timeouts are
    deadlines (seconds), not per-read timeouts.
    """

    #: Connections open at once, all clients together. At the cap a new connection
    #: closes the connection that has waited longest for its request (one still
    #: arriving, or an idle keep-alive one); only when none is waiting does it get an
    #: immediate 503. Lowered at start to fit the open-file limit
    #: (``trainmon.http.limits.connection_budget``).
    max_connections: int = field(default=1024, metadata=setting(minimum=1, maximum=100_000))
    #: Connections open at once from one client IP address; at the cap a new one
    #: closes that address's longest-waiting connection, or gets a 503 when none of
    #: its connections is waiting. A quarter of ``max_connections``: it takes four
    #: addresses to fill the server, and an address over its own cap makes room only
    #: among its own connections.
    max_connections_per_client: int = field(
        default=256, metadata=setting(minimum=1, maximum=100_000))
    #: Threads that answer whole requests (a request still arriving holds none, nor does
    #: an answer its client reads slowly). Python runs one at a time (the GIL): more
    #: help only while some wait, on a client past the output budget or a lock; each
    #: costs about 250 KiB of resident memory once it has answered.
    max_workers: int = field(default=4, metadata=setting(minimum=1, maximum=256))
    #: Largest request line and headers together (bytes); a longer head gets a 431
    #: and the connection is closed.
    max_header_bytes: int = field(
        default=16 << 10, metadata=setting(minimum=1024, maximum=1 << 20))
    #: Request bodies held in memory at once while they arrive, all connections
    #: together (bytes); at the cap the body that began arriving first is dropped with
    #: its connection. At least ``max_request_body_bytes``.
    max_buffered_body_bytes: int = field(
        default=16 << 20, metadata=setting(minimum=1024, maximum=1 << 30))
    #: Answers queued while their clients read them, all connections together (bytes):
    #: past it a worker writes its answer itself, blocking, as long as the client takes
    #: each write within ``read_timeout_seconds``.
    max_buffered_response_bytes: int = field(
        default=32 << 20, metadata=setting(minimum=64 << 10, maximum=1 << 30))
    #: Deadline for the request line and headers (and a TLS handshake), counted from
    #: when the server starts waiting for the request: accept, or the previous
    #: response on a keep-alive connection, whose idle wait it thus bounds too.
    header_timeout_seconds: float = field(default=5.0, metadata=setting(minimum=0.1, maximum=3600))
    #: Deadline for the whole request, body included, from the same moment; also for
    #: the client to take a queued answer, from the end of its worker's writing.
    read_timeout_seconds: float = field(default=10.0, metadata=setting(minimum=0.1, maximum=3600))
    max_request_body_bytes: int = field(
        default=1 << 20, metadata=setting(minimum=1024, maximum=1 << 30))

    def check(self) -> None:
        """Rules between the keys (``trainmon.section.read_section``)."""
        if self.max_buffered_body_bytes < self.max_request_body_bytes:
            raise Invalid("max_buffered_body_bytes",
                          "must be at least max_request_body_bytes (one whole body)")
