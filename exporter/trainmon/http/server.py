"""The HTTP server: ``/``, ``/metrics``, ``/healthz``, push routes, JSON read routes and
``POST /-/reload``.

The connection model (``trainmon.http.connections``): one selector thread
accepts every connection, runs its TLS handshake and reads its request, head
and body, non-blocking, under deadlines; a connection still sending costs a
file descriptor, not a thread. Only a whole request goes to one of
``http.max_workers`` worker threads, which runs ``_Handler`` over the bytes
already read and writes the answer; a kept-alive connection then goes back to
the selector. The caps (``trainmon.http.limits.ConnectionLimits``): at most
``http.max_connections_per_client`` connections from one client IP address
and ``http.max_connections`` from all (lowered to fit the open-file limit);
at a full cap the longest-waiting connection makes room, and a 503 with
``Retry-After: 1`` (with TLS: a close) goes only to a newcomer that finds
every slot answering.

Deadlines, never per-read timeouts (which a client trickling one byte at a
time could stretch forever): the TLS handshake and the request line and
headers within ``http.header_timeout_seconds`` (an idle keep-alive connection
is closed after it too), the whole request within
``http.read_timeout_seconds``, both counted from when the server starts
waiting for it; the client must take each write of a response within
``http.read_timeout_seconds``. A connection whose deadline runs out is closed
without an answer. The server's own counters,
``trainmon_http_refused_connections_total{reason}``,
``trainmon_http_evicted_connections_total{reason}`` and
``trainmon_http_request_timeouts_total{phase}``, follow the registry's
families on ``/metrics``.

``/metrics`` in the format the client's ``Accept`` asks for
(``trainmon.core.exposition.negotiate``, as prometheus_client's ``choose_encoder``
picks it): the text format 0.0.4 (what a client gets without asking for another)
by ``TextEncoder``, the bytes of prometheus_client's ``generate_latest`` at a
third of its cost; the text format 1.0.0 and OpenMetrics 1.0.0 (what Prometheus
asks for first) by the same module. A response goes out in one write, headers and
body.

Basic auth (from the web config) guards the GET routes. Push routes such as
``POST /api/v1/steps`` carry their own rule (loopback or bearer token), which
the route's handler applies, so training clients need no scrape credentials.
JSON read routes (``GET /api/v1/runs``) are GET routes: basic auth applies.
``POST /-/reload`` (``trainmon.reload``) is allowed from loopback, or with
basic-auth credentials when the web config has users.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import socketserver
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from trainmon import __version__
from trainmon.core.exposition import UNDERSCORES, TextEncoder, encode_openmetrics, negotiate
from trainmon.core.routes import (
    GetHandler,
    GetRequest,
    JSONResponse,
    PushHandler,
    PushRequest,
    PushResponse,
)
from trainmon.http.connections import Reception, Request
from trainmon.http.framing import BodyState, HeadError, head_end, parse_head
from trainmon.http.limits import ConnectionLimits, connection_budget
from trainmon.http.listen import HTTPConfig, ListenAddress
from trainmon.http.peer import ip_address_of, loopback_peer_uid
from trainmon.http.webconfig import BasicAuthenticator, WebConfig

if TYPE_CHECKING:
    from trainmon.http.certificates import CertificateKeeper

log = logging.getLogger(__name__)

__all__ = ["ExporterHTTPServer", "PushHandler", "PushRequest", "PushResponse"]


class Scrapable(Protocol):
    """What the server exposes: the registry."""

    def collect(self) -> Any: ...

    def health(self) -> dict[str, object]: ...


#: The configuration reload route, as Prometheus names it.
RELOAD_PATH = "/-/reload"


class Reloadable(Protocol):
    """What ``POST /-/reload`` asks (``trainmon.reload.Reloader``): it decides, from
    what the server knows of the peer, and reloads; its families follow the server's."""

    def answer_reload(self, *, loopback: bool, authenticated: bool) -> JSONResponse: ...

    def collect(self) -> Any: ...


class _Exposition:
    """What ``/metrics`` encodes: the registry's families, then the server's own."""

    def __init__(self, registry: Scrapable, server: ExporterHTTPServer) -> None:
        self._registry = registry
        self._server = server

    def collect(self) -> Iterator[Any]:
        yield from self._registry.collect()
        yield from self._server.limits.collect()
        yield from self._server.reception.collect()
        if self._server.tls is not None:
            yield from self._server.tls.collect()
        if self._server.reloader is not None:
            yield from self._server.reloader.collect()


class _Handler:
    """Answers one whole request the selector read (``trainmon.http.connections``), from
    memory, into the connection's writer; ``close_connection`` says whether the
    connection ends with it."""

    def __init__(self, request: Request, client_address: tuple[Any, ...],
                 server: ExporterHTTPServer) -> None:
        self.server = server
        self.client_address = client_address
        self._origin = request.connection
        self.connection = request.connection.sock
        self._writer = request.output
        self.close_connection = True
        self.request_version = "HTTP/0.9"  # no status line and no headers in an answer
        data = request.data
        length = head_end(bytearray(data)) or len(data)
        self._body_bytes = data[length:]
        try:
            self._answer(data[:length], request.body)
        except (TimeoutError, OSError):  # ConnectionError, ssl.SSLError: the client left
            self.close_connection = True
        if self._writer.stalled:
            self.close_connection = True
            self.server.limits.count_timeout("response")

    def _answer(self, head_bytes: bytes, body: BodyState) -> None:
        try:
            head = parse_head(head_bytes)
        except HeadError as error:
            self.request_version = "HTTP/1.1"
            log.debug("%s: %s", self.client_address[0], error)
            self.server.limits.count_bad_request(error.status)
            self._send_error(error.status)
            return
        if head is None:  # an empty request line: closed without an answer
            return
        self.command, self.path, self.request_version = head.method, head.target, head.version
        self.headers = head
        # bytes of an unread body would be read as the next request
        self.close_connection = not head.keep_alive or body == "unread"
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s %s", self.client_address[0], head.method, head.target)
        method = _METHODS.get(head.method)
        if method is None:
            self.close_connection = True
            self.server.limits.count_bad_request(HTTPStatus.NOT_IMPLEMENTED)
            self._send_error(HTTPStatus.NOT_IMPLEMENTED)
            return
        method(self)

    # -- routing --------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch_get(head=False)

    def do_HEAD(self) -> None:
        self._dispatch_get(head=True)

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == RELOAD_PATH and self.server.reloader is not None:
            self._reload()
            return
        handler = self.server.post_routes.get(path)
        if handler is None:
            readable = path in _GET_ROUTES or self.server.json_route(path) is not None
            allowed = "GET, HEAD" if readable else None
            self._send_error(
                HTTPStatus.METHOD_NOT_ALLOWED if allowed else HTTPStatus.NOT_FOUND, allow=allowed
            )
            return
        request = self._read_push_request()
        if request is None:
            return
        try:
            response = handler(request)
        except Exception:
            log.exception("push handler for %s failed", path)
            response = PushResponse(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})
        self._send_json(response.status, response.payload)

    def _dispatch_get(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        route = _GET_ROUTES.get(path)
        json_route = self.server.json_route(path) if route is None else None
        if route is None and json_route is None:
            reload = path == RELOAD_PATH and self.server.reloader is not None
            if path in self.server.post_routes or reload:
                self._send_error(HTTPStatus.METHOD_NOT_ALLOWED, allow="POST")
            else:
                self._send_error(HTTPStatus.NOT_FOUND)
            return
        if not self.server.authenticator.check(self.headers.header("Authorization") or None):
            self._send(
                HTTPStatus.UNAUTHORIZED,
                b"Unauthorized\n",
                "text/plain; charset=utf-8",
                head,
                extra={"WWW-Authenticate": 'Basic realm="trainmon"'},
            )
            return
        if route is not None:
            route(self, head)
            return
        assert json_route is not None
        self._json_route(json_route, path, head)

    # -- routes ---------------------------------------------------------------

    def _landing(self, head: bool) -> None:
        import html  # here: its entity table (0.3 MiB) for a page few ask for

        links = "".join(
            f'<li><a href="{html.escape(href)}">{html.escape(href)}</a> — {html.escape(text)}</li>'
            for href, text in (
                ("/metrics", "metrics in the Prometheus text format"),
                ("/healthz", "collector states as JSON"),
            )
        )
        body = (
            "<!DOCTYPE html><html><head><meta charset='utf-8'><title>trainmon</title></head>"
            f"<body><h1>trainmon {html.escape(__version__)}</h1>"
            "<p>Names the bottleneck of GPU training jobs: compute, communication, "
            f"storage or scheduling.</p><ul>{links}</ul></body></html>\n"
        )
        self._send(HTTPStatus.OK, body.encode(), "text/html; charset=utf-8", head)

    def _metrics(self, head: bool) -> None:
        kind, escaping, content_type = negotiate(self.headers.header("Accept"))
        families = _Exposition(self.server.registry, self.server).collect()
        try:
            if kind == "openmetrics":
                body = encode_openmetrics(families, escaping)
            elif escaping == UNDERSCORES:  # 0.0.4, or 1.0.0 alike: what repeats remembered
                body = self.server.text_encoder.encode(families)
            else:
                body = TextEncoder(escaping).encode(families)
        except Exception:
            log.exception("building the exposition failed")
            self._send_error(HTTPStatus.INTERNAL_SERVER_ERROR)
            return
        extra = {}
        if accepts_gzip(self.headers.header("Accept-Encoding")):
            body = gzip.compress(body, compresslevel=1)
            extra["Content-Encoding"] = "gzip"
        self._send(HTTPStatus.OK, body, content_type, head, extra=extra)

    def _healthz(self, head: bool) -> None:
        body = json.dumps(self.server.registry.health(), sort_keys=True).encode() + b"\n"
        self._send(HTTPStatus.OK, body, "application/json", head)

    def _reload(self) -> None:
        """``POST /-/reload``: from a loopback peer, or with the web config's basic-auth
        credentials (none configured: loopback only); the reloader decides and answers."""
        reloader = self.server.reloader
        assert reloader is not None
        authenticator = self.server.authenticator
        authenticated = authenticator.required and authenticator.check(
            self.headers.header("Authorization") or None)
        response = reloader.answer_reload(loopback=_is_loopback(self.client_address[0]),
                                          authenticated=authenticated)
        self._send(response.status, response.encoded(), "application/json", False,
                   extra=response.headers)

    def _json_route(self, handler: GetHandler, path: str, head: bool) -> None:
        query = urllib.parse.parse_qs(self.path.partition("?")[2], keep_blank_values=True)
        request = GetRequest(urllib.parse.unquote(path),
                             {key: values[0] for key, values in query.items()})
        try:
            response = handler(request)
        except Exception:
            log.exception("GET handler for %s failed", path)
            response = JSONResponse(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})
        self._send(response.status, response.encoded(), "application/json", head,
                   extra=response.headers)

    # -- plumbing -------------------------------------------------------------

    def _read_push_request(self) -> PushRequest | None:
        if "chunked" in self.headers.header("Transfer-Encoding").lower():
            self._send_error(HTTPStatus.LENGTH_REQUIRED)
            return None
        try:
            length = int(self.headers.header("Content-Length"))
            if length < 0:
                raise ValueError
        except ValueError:
            self._send_error(HTTPStatus.LENGTH_REQUIRED)
            return None
        host = self.client_address[0]
        loopback = _is_loopback(host)
        common: dict[str, Any] = {
            "client_host": host,
            "is_loopback": loopback,
            "peer_uid": self._loopback_user() if loopback else None,
            "authorization": self.headers.header("Authorization") or None,
        }
        if length > self.server.max_body_bytes:
            # dropped (up to MAX_DISCARDED_BODY_BYTES) or never read by the selector
            self.close_connection = True
            return PushRequest(body=b"", too_large=True, **common)
        return PushRequest(body=self._body_bytes[:length], **common)

    def _loopback_user(self) -> int | None:
        """The local user of this loopback connection's client socket, asked of the
        kernel at the connection's first push and kept while it lasts (the socket,
        and so its owner, cannot change under an open connection)."""
        origin = self._origin
        if not origin.peer_asked:
            origin.peer_asked = True
            local = self.connection.getsockname()
            origin.peer_uid = loopback_peer_uid(
                str(self.client_address[0]), int(self.client_address[1]),
                str(local[0]), int(local[1]))
        return origin.peer_uid

    def _send_json(self, status: int, payload: Mapping[str, object]) -> None:
        body = json.dumps(payload, sort_keys=True).encode() + b"\n"
        self._send(status, body, "application/json", head=False)

    def _send_error(self, status: HTTPStatus, allow: str | None = None) -> None:
        extra = {"Allow": allow} if allow else {}
        self._send(status, f"{status.phrase}\n".encode(), "text/plain; charset=utf-8", False, extra)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        head: bool,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        if self.request_version == "HTTP/0.9":  # no status line, no headers
            self._writer.write(b"" if head else body)
            return
        lines = [f"HTTP/1.1 {status} {_phrase(status)}", f"Server: {SERVER_VERSION}",
                 f"Date: {http_date(time.time())}", f"Content-Type: {content_type}",
                 f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}"
                  for name, value in {**self.server.extra_headers, **(extra or {})}.items()]
        if self.close_connection:
            lines.append("Connection: close")
        # one write, head and body: one system call, one TCP segment for a small answer
        head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        self._writer.write(head_bytes if head else head_bytes + body)


_GET_ROUTES: dict[str, Callable[[_Handler, bool], None]] = {
    "/": _Handler._landing,
    "/metrics": _Handler._metrics,
    "/healthz": _Handler._healthz,
}
#: The methods answered (others: 501).
_METHODS: dict[str, Callable[[_Handler], None]] = {
    "GET": _Handler.do_GET, "HEAD": _Handler.do_HEAD, "POST": _Handler.do_POST,
}
#: The ``Server`` header of every answer.
SERVER_VERSION = f"trainmon/{__version__}"
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(unix: float) -> str:
    """``Date`` as HTTP writes it (RFC 9110 §5.6.7: ``Sun, 06 Nov 1994 08:49:37 GMT``),
    whatever the locale."""
    moment = time.gmtime(unix)
    return (f"{_DAYS[moment.tm_wday]}, {moment.tm_mday:02d} {_MONTHS[moment.tm_mon - 1]} "
            f"{moment.tm_year} {moment.tm_hour:02d}:{moment.tm_min:02d}:{moment.tm_sec:02d} GMT")


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class ExporterHTTPServer(socketserver.TCPServer):
    """The HTTP server: connections wait on one selector thread and are answered by a
    few workers (``trainmon.http.connections``), under caps and deadlines."""

    allow_reuse_address = True
    #: The listen backlog; the kernel caps it at ``net.core.somaxconn`` (4096 since
    #: Linux 5.4). Connections queue there while the selector thread accepts a burst.
    request_queue_size = 4096

    def __init__(
        self,
        listen: ListenAddress,
        registry: Scrapable,
        http: HTTPConfig,
        web: WebConfig | None = None,
        post_routes: Mapping[str, PushHandler] | None = None,
        get_routes: Mapping[str, GetHandler] | None = None,
        reloader: Reloadable | None = None,
    ) -> None:
        self.registry = registry
        #: ``POST /-/reload``'s; None: no such route.
        self.reloader = reloader
        self.get_routes = dict(get_routes or {})
        self.read_timeout = http.read_timeout_seconds
        self.header_timeout = min(http.header_timeout_seconds, http.read_timeout_seconds)
        self.max_body_bytes = http.max_request_body_bytes
        self.post_routes = dict(post_routes or {})
        web = web or WebConfig()
        self.extra_headers = dict(web.headers)
        self.authenticator = BasicAuthenticator(web.basic_auth_users)
        #: The TLS context, loaded again when its files change (None: plain HTTP).
        self.tls: CertificateKeeper | None = None
        if web.tls is not None:  # loaded with a TLS web config only, as ssl is
            from trainmon.http.certificates import CertificateKeeper
            self.tls = CertificateKeeper(web.tls)
        self.limits = ConnectionLimits(
            connection_budget(http.max_connections), http.max_connections_per_client,
            max_header_bytes=http.max_header_bytes,
            max_buffered_body_bytes=http.max_buffered_body_bytes,
        )
        self.text_encoder = TextEncoder()
        self.address_family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        # TCPServer binds and listens; its handler class is never called: the reception
        # reads every request and a worker answers it (``_answer``)
        super().__init__((listen.host, listen.port), socketserver.BaseRequestHandler)
        #: The selector thread and the workers (``trainmon.http.connections``).
        self.reception = Reception(self.socket, self.limits, http, self._answer, self.tls)

    def replace_routes(self, post_routes: Mapping[str, PushHandler],
                       get_routes: Mapping[str, GetHandler]) -> None:
        """Serve these push and JSON routes from now on (a reload changed the collectors);
        a request being answered keeps the table it found."""
        self.post_routes, self.get_routes = dict(post_routes), dict(get_routes)

    def replace_access(self, web: WebConfig | None) -> None:
        """The web config's basic-auth users and headers from now on (a reload); its TLS
        settings stay the ones the server started with, their files are looked at now."""
        if self.tls is not None:
            self.tls.check()
        web = web or WebConfig()
        self.extra_headers = dict(web.headers)
        self.authenticator = BasicAuthenticator(web.basic_auth_users)

    def json_route(self, path: str) -> GetHandler | None:
        """The JSON read route for ``path``: exact, else the longest ``…/`` prefix."""
        exact = self.get_routes.get(path)
        if exact is not None:
            return exact
        prefixes = [prefix for prefix in self.get_routes
                    if prefix.endswith("/") and path.startswith(prefix) and path != prefix]
        return self.get_routes[max(prefixes, key=len)] if prefixes else None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            # "[::]" serves IPv4 too, as Go's listeners do.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # TCPServer's bind, not HTTPServer's: that one also resolves the address back to a
        # name (socket.getfqdn), a reverse DNS lookup that can hang a node's start on a
        # broken resolver and loads the idna codec (0.4 MiB), for a server_name only CGI uses.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until ``shutdown``: the selector thread is the caller's."""
        self.reception.serve(poll_interval)

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait for it; requests already whole are still
        answered by the workers, connections waiting for theirs are closed."""
        self.reception.stop()

    def server_close(self) -> None:
        super().server_close()
        # TCPServer's __init__ closes the socket of a failed bind itself, before the
        # reception exists (a taken port: "cannot listen on …")
        reception: Reception | None = getattr(self, "reception", None)
        if reception is not None:
            reception.close()

    def _answer(self, request: Request) -> bool:
        """A worker answers one whole request; True keeps the connection open."""
        handler = _Handler(request, request.connection.address, self)
        return not handler.close_connection


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header (RFC 9110 §12.5.3) lets the body be gzipped.

    Codings are case-insensitive and weighted by ``q`` (default 1; ``q=0`` is a
    refusal); ``*`` stands for every coding not named, ``identity`` included;
    ``x-gzip`` is ``gzip``. gzip is chosen when it is acceptable, unless the
    header weights ``identity`` (by name or through ``*``) above it; an
    unweighted identity is only the fallback. An entry whose ``q`` does not
    parse is ignored.
    """
    weights: dict[str, float] = {}
    for entry in accept_encoding.split(","):
        coding, *parameters = (part.strip() for part in entry.split(";"))
        weight = _quality(parameters)
        if coding and weight is not None:
            coding = coding.lower()
            weights["gzip" if coding == "x-gzip" else coding] = weight
    default = weights.get("*")
    gzip_weight = weights.get("gzip", default or 0.0)
    identity_weight = weights.get("identity", default or 0.0)
    return gzip_weight > 0 and gzip_weight >= identity_weight


def _quality(parameters: list[str]) -> float | None:
    """The ``q`` of one ``Accept-Encoding`` entry (1 without one); None if it does not parse."""
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                weight = float(value.strip())
            except ValueError:
                return None
            return weight if 0.0 <= weight <= 1.0 else None
    return 1.0


def _is_loopback(host: str) -> bool:
    try:
        return ip_address_of(host).is_loopback
    except ValueError:
        return False
