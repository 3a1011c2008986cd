"""``trainmon.outbound`` beyond its deadlines: TLS, forward proxies, the environment's proxy rule.

The deadline tests live in tests/security/test_deadlines.py. Here a TLS server
with a throw-away certificate (made with ``openssl``) and a ``CONNECT`` proxy
on loopback stand in for Tencent Cloud's API endpoint behind an egress proxy.
"""

from __future__ import annotations

import select
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from trainmon import outbound


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello over tls"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def certificate(tmp_path: Path) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem"),
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return tmp_path


@pytest.fixture
def tls_server(certificate: Path) -> Iterator[str]:
    """``https://127.0.0.1:<port>`` answering every GET with 200."""
    server = HTTPServer(("127.0.0.1", 0), _Hello)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate / "cert.pem", certificate / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


class ConnectProxy:
    """A forward proxy that serves ``CONNECT`` tunnels (one at a time) and records them."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self._stop = threading.Event()
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            with client:
                self._tunnel(client)

    def _tunnel(self, client: socket.socket) -> None:
        client.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 8192:
            head += client.recv(8192)
        self.requests.append(head)
        authority = head.split(b" ")[1].decode()
        host, _, port = authority.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5) as upstream:
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            for _ in range(1000):  # bounded: a test exchange is a few round trips
                ready, _, _ = select.select([client, upstream], [], [], 5)
                if not ready:
                    return
                for source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    (upstream if source is client else client).sendall(data)


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    server = ConnectProxy()
    yield server
    server.close()


def trusting(certificate: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificate / "cert.pem"))


def test_https_with_a_trusted_certificate(tls_server: str, certificate: Path) -> None:
    response = outbound.request("GET", tls_server + "/", timeout=5,
                                ssl_context=trusting(certificate))
    assert (response.status, response.body) == (200, b"hello over tls")


def test_an_untrusted_certificate_is_unreachable(tls_server: str) -> None:
    with pytest.raises(outbound.OutboundError) as caught:
        outbound.request("GET", tls_server + "/", timeout=5)
    assert caught.value.reason == "unreachable"
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


def test_https_through_a_connect_tunnel(
    tls_server: str, certificate: Path, proxy: ConnectProxy,
) -> None:
    response = outbound.request("GET", tls_server + "/x", timeout=5,
                                ssl_context=trusting(certificate), proxy=proxy.url)
    assert response.body == b"hello over tls"
    authority = tls_server.removeprefix("https://")
    assert proxy.requests == [f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
                              .encode()]


def test_plain_http_through_a_proxy_uses_the_absolute_uri() -> None:
    seen: list[Request] = []

    def answer(request: Request) -> Reply:
        seen.append(request)
        return Reply.text("via proxy")

    with LoopbackHTTPServer(answer) as fake_proxy:
        response = outbound.request("GET", "http://monitor.example.invalid/a?b=1", timeout=5,
                                    proxy=fake_proxy.url)
    assert response.body == b"via proxy"
    assert seen[0].path == "http://monitor.example.invalid/a?b=1"


def test_the_environment_names_the_proxy_unless_no_proxy_exempts_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                 "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert outbound.environment_proxy("https://monitor.tencentcloudapi.com/") is None
    monkeypatch.setenv("HTTPS_PROXY", "proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "internal.tencentcloudapi.com")
    assert outbound.environment_proxy("https://monitor.tencentcloudapi.com/") == \
        "http://proxy.corp:3128"
    assert outbound.environment_proxy("https://monitor.internal.tencentcloudapi.com/") is None
    assert outbound.environment_proxy("http://metadata.tencentyun.com/") is None


class _Chunked(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        for part in (b"hello ", b"in ", b"chunks"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize(("handler", "body"), [
    (_Hello, b"hello over tls"),  # HTTP/1.0: the server closes after the body
    (_Chunked, b"hello in chunks"),
])
def test_answers_that_close_the_connection_or_come_in_chunks(
    handler: type[BaseHTTPRequestHandler], body: bytes,
) -> None:
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        response = outbound.request("GET", f"http://127.0.0.1:{server.server_address[1]}/",
                                    timeout=5)
        assert (response.status, response.body) == (200, body)
        with pytest.raises(outbound.OutboundError) as caught:
            outbound.request("GET", f"http://127.0.0.1:{server.server_address[1]}/",
                             timeout=5, max_body_bytes=len(body) - 1)
        assert caught.value.reason == "too_large"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
