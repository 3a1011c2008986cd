"""Where the HTTP server listens and how long it waits: the ``listen`` key and the ``http`` section.

``parse_listen_address`` reads ``listen`` (and ``--listen``, ``$TRAINMON_LISTEN``);
``HTTPConfig`` is the ``http`` section, read by ``trainmon.section.read_section``
with the bounds of its fields. ``trainmon.http.server`` documents the connection
model these limits bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainmon.section import setting

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

    Connections are counted while open; timeouts are deadlines (seconds), not
    per-read timeouts. ``trainmon.http.server`` documents the connection model.
    """

    #: Connections open at once, all clients together; more get an immediate 503.
    max_connections: int = field(default=64, metadata=setting(minimum=1, maximum=100_000))
    #: Connections open at once from one client IP address; more get an immediate 503.
    #: A quarter of ``max_connections``: it takes four addresses to fill the server,
    #: and one Prometheus (one connection per target) plus the HTTP pushes of a
    #: node's ranks (one short connection per report) stay far below it.
    max_connections_per_client: int = field(
        default=16, metadata=setting(minimum=1, maximum=100_000))
    #: Deadline for the request line and headers (and a TLS handshake), counted from
    #: when the server starts waiting for the request: accept, or the previous
    #: response on a keep-alive connection, whose idle wait it thus bounds too.
    header_timeout_seconds: float = field(default=5.0, metadata=setting(minimum=0.1, maximum=3600))
    #: Deadline for the whole request, body included, from the same moment.
    read_timeout_seconds: float = field(default=10.0, metadata=setting(minimum=0.1, maximum=3600))
    max_request_body_bytes: int = field(
        default=1 << 20, metadata=setting(minimum=1024, maximum=1 << 30))
