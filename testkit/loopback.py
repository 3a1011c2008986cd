"""A loopback HTTP server for the fakes that stand in for remote services.

Every fake of the test suite (dcgm-exporter, the CVM metadata service, the
Tencent Cloud API, a kubelet, an Alertmanager webhook receiver, a running
daemon's ``/metrics``) is the same server with its own answer function:
``LoopbackHTTPServer(answer)`` binds 127.0.0.1 on a free port, serves from a
daemon thread (HTTP/1.1, keep-alive) and calls ``answer(request)`` for every
request, whatever the method. A fake with state subclasses it and passes its
own method: ``super().__init__(self._answer)``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar


@dataclass(frozen=True)
class Request:
    """One request as the fake sees it; header names are lower-case."""

    method: str
    #: The request target with its query string, e.g. ``/latest/meta-data/placement/region``.
    path: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Reply:
    """What to answer: ``delay`` seconds of stalling first (timeout tests)."""

    status: int = 200
    body: bytes = b""
    content_type: str | None = None
    delay: float = 0.0

    @classmethod
    def json(cls, payload: object, status: int = 200) -> Reply:
        return cls(status, json.dumps(payload).encode(), "application/json")

    @classmethod
    def text(cls, text: str, content_type: str = "text/plain; charset=utf-8",
             status: int = 200) -> Reply:
        return cls(status, text.encode(), content_type)


Answer = Callable[[Request], Reply]
Server = TypeVar("Server", bound="LoopbackHTTPServer")


class LoopbackHTTPServer:
    """``with LoopbackHTTPServer(answer) as server: server.url`` (or ``start()``/``stop()``).

    ``clock`` (Unix seconds) sets the ``Date`` header, for fakes with a skewed clock.
    """

    def __init__(self, answer: Answer, *, clock: Callable[[], float] = time.time) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(answer, clock))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, as a Prometheus scrape target."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self: Server) -> Server:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self: Server) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(answer: Answer, clock: Callable[[], float]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body leave in two writes

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_PUT(self) -> None:
            self._serve()

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {name.lower(): value for name, value in self.headers.items()}
            reply = answer(Request(self.command, self.path, headers, body))
            if reply.delay:
                time.sleep(reply.delay)
            try:
                self.send_response(reply.status)
                if reply.content_type is not None:
                    self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
            except OSError:
                pass  # the client gave up (timeout tests)

        def date_time_string(self, timestamp: float | None = None) -> str:
            return formatdate(clock() if timestamp is None else timestamp, usegmt=True)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler
