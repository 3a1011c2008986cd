"""Fixtures for the HTTP server tests: an in-process server over a tiny source, TLS files."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.sources import SteadySource
from trainmon.core.collector import Collector
from trainmon.core.registry import CollectorRegistry
from trainmon.core.routes import PushHandler
from trainmon.http.listen import HTTPConfig, ListenAddress
from trainmon.http.server import ExporterHTTPServer
from trainmon.http.webconfig import WebConfig

ServerFactory = Callable[..., ExporterHTTPServer]


@pytest.fixture
def serve() -> Iterator[ServerFactory]:
    """``serve(collectors=..., http=..., web=..., post_routes=...)`` → a running server."""
    servers: list[ExporterHTTPServer] = []

    def start(
        collectors: list[Collector] | None = None,
        http: HTTPConfig | None = None,
        web: WebConfig | None = None,
        post_routes: dict[str, PushHandler] | None = None,
    ) -> ExporterHTTPServer:
        registry = CollectorRegistry(collectors if collectors is not None else [SteadySource()])
        registry.start()
        server = ExporterHTTPServer(
            ListenAddress("127.0.0.1", 0), registry, http or HTTPConfig(), web, post_routes
        )
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 signed by it, and a client certificate."""
    folder = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    for name, extension in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        (folder / f"{name}.ext").write_text(extension + "\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.crt",
        )
    return {
        name: folder / name
        for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")
    }
