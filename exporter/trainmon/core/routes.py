"""The HTTP routes a collector serves: the types between the server and collectors.

A collector that takes data over HTTP (the training receiver's
``POST /api/v1/steps``) returns its routes from ``Collector.push_routes()``;
the server (``trainmon.http.server``) reads and size-checks the body and hands
it over as a ``PushRequest``. The handler applies its own access rule and
answers with a ``PushResponse`` that the server sends as JSON.

Read-only JSON routes (the run ledger's ``GET /api/v1/runs``) work the same
way in the other direction, from ``Collector.get_routes()``: a ``GetHandler``
takes a ``GetRequest`` (path and query, after the server's basic-auth check)
and returns a ``JSONResponse``. A route registered with a trailing ``/``
serves every path below it.

These types live in the core, beside the collector contract that names them,
so that neither the collectors nor the contract import the HTTP server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PushRequest:
    """A POST to a push route, already size-checked by the server."""

    body: bytes
    client_host: str
    is_loopback: bool
    authorization: str | None
    #: The body exceeded ``http.max_request_body_bytes`` and was not read.
    too_large: bool = False
    #: For a loopback client: the local user owning its socket, as the kernel
    #: names it (``trainmon.http.peer``, looked up once per connection); None
    #: for other clients or when the kernel does not say.
    peer_uid: int | None = None


@dataclass(frozen=True)
class PushResponse:
    status: int
    payload: dict[str, object] = field(default_factory=dict)


PushHandler = Callable[[PushRequest], PushResponse]


@dataclass(frozen=True)
class GetRequest:
    """A GET to a JSON route: the path and the query (first value of each key)."""

    path: str
    query: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JSONResponse:
    status: int
    #: Any JSON-serialisable value (a list of records, an error object), or the JSON
    #: text already encoded (``bytes``: a route that builds its body record by record).
    body: object
    #: Further response headers (``Link``, ``Retry-After``).
    headers: Mapping[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        """The body as sent: the bytes given, or the value as JSON and a newline."""
        if isinstance(self.body, bytes):
            return self.body
        return json.dumps(self.body, sort_keys=True).encode() + b"\n"


GetHandler = Callable[[GetRequest], JSONResponse]
