"""The HTTP server: routes, content negotiation, push routes, auth, TLS and limits."""

from __future__ import annotations

import email.utils
import gzip
import json
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import bcrypt
import pytest
import requests
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from testkit.sources import AbsentSource, BrokenSource, SteadySource
from trainmon import __version__
from trainmon.core.collector import Collector
from trainmon.core.routes import PushRequest, PushResponse
from trainmon.http.listen import HTTPConfig
from trainmon.http.server import ExporterHTTPServer
from trainmon.http.webconfig import TLSSettings, WebConfig


def url(server: object, path: str = "/", scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{server.port}{path}"  # type: ignore[attr-defined]


def test_landing_page_links_the_routes(serve: Callable[..., ExporterHTTPServer]) -> None:
    response = requests.get(url(serve()), timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    assert 'href="/metrics"' in response.text and 'href="/healthz"' in response.text


def test_metrics_in_text_format(serve: Callable[..., ExporterHTTPServer]) -> None:
    response = requests.get(url(serve(), "/metrics"), timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert families["example_value"].samples[0].value == 1.0
    assert families["example_events"].type == "counter"
    assert 'example_events_total{device="a"} 3.0' in response.text
    success = families["trainmon_collector_success"].samples
    assert [(s.labels["collector"], s.value) for s in success] == [("steady", 1.0)]
    assert families["trainmon_build_info"].samples[0].labels["mode"] == "real"


def test_openmetrics_when_asked(serve: Callable[..., ExporterHTTPServer]) -> None:
    response = requests.get(
        url(serve(), "/metrics"),
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        timeout=5,
    )
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")


def test_gzip_when_accepted(serve: Callable[..., ExporterHTTPServer]) -> None:
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n"
            b"Connection: close\r\n\r\n"
        )
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Content-Encoding: gzip" in head
    assert b"example_value" in gzip.decompress(body)


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("gzip", True),
        ("GZip", True),  # codings are case-insensitive
        ("x-gzip", True),
        ("deflate, gzip;q=0.5", True),
        ("br;q=1.0, gzip;q=0.8, *;q=0.1", True),
        ("*", True),
        ("identity;q=0.5, gzip", True),
        ("gzip;q=0", False),  # a refusal, although the word gzip is there
        ("gzip; Q=0.000", False),
        ("gzip;q=0, *", False),  # the named coding wins over *
        ("*;q=0", False),
        ("identity", False),
        ("br, deflate", False),
        ("gzip;q=0.5, identity", False),  # identity (q=1) is preferred
        ("gzip;q=bogus", False),  # an entry that does not parse is ignored
        ("", False),
    ],
)
def test_gzip_follows_the_accept_encoding_weights(
    serve: Callable[..., ExporterHTTPServer], accept_encoding: str, gzipped: bool
) -> None:
    response = requests.get(
        url(serve(), "/metrics"), headers={"Accept-Encoding": accept_encoding}, timeout=5
    )
    assert response.status_code == 200
    assert response.headers.get("Content-Encoding") == ("gzip" if gzipped else None)
    assert "example_value" in response.text  # requests decodes the gzip body


def test_fresh_values_every_scrape(serve: Callable[..., ExporterHTTPServer]) -> None:
    source = SteadySource()
    server = serve([source])
    source.value = 42.0
    assert 'example_value{device="a"} 42.0' in requests.get(url(server, "/metrics"), timeout=5).text


def test_a_failing_collector_does_not_fail_the_scrape(
    serve: Callable[..., ExporterHTTPServer],
) -> None:
    server = serve([BrokenSource(), SteadySource(), AbsentSource()])
    response = requests.get(url(server, "/metrics"), timeout=5)
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    success = {
        s.labels["collector"]: s.value for s in families["trainmon_collector_success"].samples
    }
    assert success == {"broken": 0.0, "steady": 1.0, "absent": 0.0}
    available = {
        s.labels["collector"]: s.value for s in families["trainmon_collector_available"].samples
    }
    assert available == {"broken": 1.0, "steady": 1.0, "absent": 0.0}
    durations = families["trainmon_collector_duration_seconds"].samples
    assert {s.labels["collector"] for s in durations} == {"broken", "steady", "absent"}
    assert "example_value" in families

    health = requests.get(url(server, "/healthz"), timeout=5)
    assert health.status_code == 200 and health.headers["Content-Type"] == "application/json"
    collectors = health.json()["collectors"]
    assert collectors["broken"]["state"] == "failed"
    assert collectors["broken"]["error"] == "OSError: the device went away"
    assert collectors["steady"]["state"] == "ok"
    assert collectors["absent"] == {
        "state": "unavailable",
        "error": "no such hardware on this machine",
        "duration_seconds": pytest.approx(0, abs=0.1),
        "last_success_timestamp": None,
    }


def test_unknown_paths_and_methods(serve: Callable[..., ExporterHTTPServer]) -> None:
    server = serve(post_routes={"/api/v1/steps": lambda request: PushResponse(202)})
    assert requests.get(url(server, "/nope"), timeout=5).status_code == 404
    wrong = requests.post(url(server, "/metrics"), data=b"x", timeout=5)
    assert wrong.status_code == 405 and wrong.headers["Allow"] == "GET, HEAD"
    get_push = requests.get(url(server, "/api/v1/steps"), timeout=5)
    assert get_push.status_code == 405 and get_push.headers["Allow"] == "POST"
    head = requests.head(url(server, "/metrics"), timeout=5)
    assert head.status_code == 200 and head.content == b""


def test_push_routes_get_the_body_and_its_origin(serve: Callable[..., ExporterHTTPServer]) -> None:
    received: list[PushRequest] = []

    def handler(request: PushRequest) -> PushResponse:
        received.append(request)
        if request.too_large:
            return PushResponse(413, {"error": "too large"})
        return PushResponse(202, {"accepted": request.body.count(b"\n")})

    server = serve(
        http=HTTPConfig(max_request_body_bytes=1024), post_routes={"/api/v1/steps": handler}
    )
    ok = requests.post(
        url(server, "/api/v1/steps"),
        data=b'{"v":1}\n{"v":1}\n',
        headers={"Authorization": "Bearer t", "Content-Type": "application/x-ndjson"},
        timeout=5,
    )
    assert ok.status_code == 202 and ok.json() == {"accepted": 2}
    first = received[0]
    assert first.body == b'{"v":1}\n{"v":1}\n'
    assert first.is_loopback and first.client_host == "127.0.0.1"
    assert first.authorization == "Bearer t"

    big = requests.post(url(server, "/api/v1/steps"), data=b"x" * 2048, timeout=5)
    assert big.status_code == 413
    assert received[1].too_large and received[1].body == b""


def test_push_without_length_is_refused(serve: Callable[..., ExporterHTTPServer]) -> None:
    server = serve(post_routes={"/api/v1/steps": lambda request: PushResponse(202)})

    def chunks():  # type: ignore[no-untyped-def]
        yield b"{}"

    response = requests.post(url(server, "/api/v1/steps"), data=chunks(), timeout=5)
    assert response.status_code == 411


def test_a_crashing_push_handler_answers_500(serve: Callable[..., ExporterHTTPServer]) -> None:
    def handler(request: PushRequest) -> PushResponse:
        raise RuntimeError("bug")

    server = serve(post_routes={"/api/v1/steps": handler})
    response = requests.post(url(server, "/api/v1/steps"), data=b"{}", timeout=5)
    assert response.status_code == 500 and response.json() == {"error": "internal error"}
    assert requests.get(url(server, "/metrics"), timeout=5).status_code == 200


def test_basic_auth_guards_scrapes_but_not_pushes(serve: Callable[..., ExporterHTTPServer]) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))
    web = WebConfig(basic_auth_users={"prometheus": hashed}, headers={"X-Frame-Options": "deny"})
    server = serve(web=web, post_routes={"/api/v1/steps": lambda request: PushResponse(202)})
    denied = requests.get(url(server, "/metrics"), timeout=5)
    assert denied.status_code == 401
    assert denied.headers["WWW-Authenticate"] == 'Basic realm="trainmon"'
    assert (
        requests.get(url(server, "/metrics"), auth=("prometheus", "wrong"), timeout=5).status_code
        == 401
    )
    assert (
        requests.get(url(server, "/metrics"), auth=("nobody", "s3cret"), timeout=5).status_code
        == 401
    )
    for _ in range(2):  # the second check comes from the verified-credential cache
        allowed = requests.get(url(server, "/metrics"), auth=("prometheus", "s3cret"), timeout=5)
        assert allowed.status_code == 200 and "example_value" in allowed.text
        assert allowed.headers["X-Frame-Options"] == "deny"
    assert requests.post(url(server, "/api/v1/steps"), data=b"{}", timeout=5).status_code == 202


def test_tls_with_client_certificates(
    serve: Callable[..., ExporterHTTPServer], tls_files: dict[str, Path]
) -> None:
    web = WebConfig(
        tls=TLSSettings(
            cert_file=tls_files["server.crt"],
            key_file=tls_files["server.key"],
            client_auth_type="RequireAndVerifyClientCert",
            client_ca_file=tls_files["ca.crt"],
        )
    )
    server = serve(web=web)
    response = requests.get(
        url(server, "/metrics", "https"),
        verify=str(tls_files["ca.crt"]),
        cert=(str(tls_files["client.crt"]), str(tls_files["client.key"])),
        timeout=5,
    )
    assert response.status_code == 200 and "example_value" in response.text
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url(server, "/metrics", "https"), verify=str(tls_files["ca.crt"]), timeout=5)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(url(server, "/metrics"), timeout=5)


def test_a_stalled_tls_handshake_does_not_block_others(
    serve: Callable[..., ExporterHTTPServer], tls_files: dict[str, Path]
) -> None:
    web = WebConfig(
        tls=TLSSettings(cert_file=tls_files["server.crt"], key_file=tls_files["server.key"])
    )
    server = serve(web=web, http=HTTPConfig(read_timeout_seconds=2))
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
    try:
        context = ssl.create_default_context(cafile=str(tls_files["ca.crt"]))
        started = time.monotonic()
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert tls.recv(12) == b"HTTP/1.1 200"
        assert time.monotonic() - started < 1.5
    finally:
        for sock in silent:
            sock.close()


def test_a_trickling_client_is_cut_off_at_the_deadline(
    serve: Callable[..., ExporterHTTPServer],
) -> None:
    server = serve(http=HTTPConfig(read_timeout_seconds=1))
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        try:
            for byte in request:  # one byte every 50 ms: each read is quick, the whole is not
                sock.sendall(bytes([byte]))
                time.sleep(0.05)
        except OSError:
            pass
        assert sock.recv(100) in (b"",)  # closed without an answer
    assert time.monotonic() - started < 4


def test_web_config_headers_are_sent(serve: Callable[..., ExporterHTTPServer]) -> None:
    server = serve(web=WebConfig(headers={"Strict-Transport-Security": "max-age=1"}))
    assert (
        requests.get(url(server, "/healthz"), timeout=5).headers["Strict-Transport-Security"]
        == "max-age=1"
    )


def test_healthz_reports_version_and_mode(serve: Callable[..., ExporterHTTPServer]) -> None:
    body = json.loads(requests.get(url(serve(), "/healthz"), timeout=5).text)
    assert body["mode"] == "real" and body["version"]
    assert body["collectors"]["steady"]["state"] == "ok"


#: Label values with every character the text format escapes, and then some.
HOSTILE_JOBS = ('a"b', "back\\slash", "new\nline", "}{,=", "", "作业", '\\"\n')


class HostileLabels(Collector):
    name = "hostile"

    def family(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily("example_job_info", 'HELP with \\ and\n"quotes"',
                                   labels=["job"])
        for value in HOSTILE_JOBS:
            family.add_metric([value], 1)
        return family

    def collect(self) -> Iterable[Metric]:
        return [self.family()]


class OneCollector:
    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return [self._family]


def test_text_format_writes_what_prometheus_client_writes(
    serve: Callable[..., ExporterHTTPServer],
) -> None:
    source = HostileLabels()
    server = serve(collectors=[source, SteadySource()])
    for _ in range(3):  # the first scrape, then from what the encoder remembered
        body = requests.get(url(server, "/metrics"), timeout=5).content
        assert generate_latest(OneCollector(source.family())) in body  # type: ignore[arg-type]
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        jobs = [s.labels["job"] for s in families["example_job_info"].samples]
        assert jobs == list(HOSTILE_JOBS)


def test_text_format_1_0_0_in_the_escaping_asked_for(
    serve: Callable[..., ExporterHTTPServer],
) -> None:
    response = requests.get(
        url(serve(), "/metrics"),
        headers={"Accept": "text/plain; version=1.0.0; escaping=allow-utf-8"},
        timeout=5,
    )
    assert response.headers["Content-Type"].endswith("escaping=allow-utf-8")
    assert 'example_events_total{device="a"} 3.0' in response.text


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    return raw


def test_head_gets_the_headers_of_get_without_the_body(
    serve: Callable[..., ExporterHTTPServer],
) -> None:
    server = serve()
    raw = _exchange(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: " in head
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) > 0
    assert body == b""


def test_responses_on_one_kept_alive_connection_and_to_http_0_9(
    serve: Callable[..., ExporterHTTPServer],
) -> None:
    server = serve()
    two = _exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                                 b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    first, _, rest = two.partition(b"\r\n\r\n")
    length = int(first.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    assert b"example_value" in rest[:length]
    second_head, _, second_body = rest[length:].partition(b"\r\n\r\n")
    assert second_head.startswith(b"HTTP/1.1 200") and json.loads(second_body)["mode"] == "real"
    old = _exchange(server.port, b"GET /metrics\r\n\r\n")  # HTTP/0.9: the body alone
    assert old.startswith(b"# HELP") and b"example_value" in old


def test_binding_resolves_no_name(serve: Callable[..., ExporterHTTPServer],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTPServer's own bind looks the listen address up in DNS (socket.getfqdn), which
    can hang a start on a broken resolver; the daemon's binds without it."""
    def no_lookup(name: str = "") -> str:
        raise AssertionError(f"getfqdn({name!r}) at bind")

    monkeypatch.setattr(socket, "getfqdn", no_lookup)
    server = serve()
    assert (server.server_name, server.server_port) == ("127.0.0.1", server.port)
    assert requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).status_code == 200


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n", b"501"),
    (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", b"505"),
    (b"GET / HTTP/one\r\nHost: x\r\n\r\n", b"400"),
])
def test_a_request_the_server_does_not_take_is_answered_and_closed(
    serve: Callable[..., ExporterHTTPServer], request_bytes: bytes, status: bytes,
) -> None:
    server = serve()
    raw = _exchange(server.port, request_bytes)  # returns once the server closed
    head = raw.partition(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0].startswith(b"HTTP/1.1 " + status)
    assert b"Connection: close" in head
    families = {f.name: f for f in text_string_to_metric_families(
        requests.get(url(server, "/metrics"), timeout=5).text)}
    counted = {s.labels["code"]: s.value for s in families["trainmon_http_bad_requests"].samples
               if s.name.endswith("_total")}
    assert counted == {code: float(code == status.decode())
                       for code in ("400", "414", "431", "501", "505")}


def test_every_answer_names_the_server_and_the_date(
    serve: Callable[..., ExporterHTTPServer],
) -> None:
    response = requests.get(url(serve(), "/healthz"), timeout=5)
    assert response.headers["Server"] == f"trainmon/{__version__}"
    sent = email.utils.parsedate_to_datetime(response.headers["Date"])
    assert abs(sent.timestamp() - time.time()) < 60
