"""Connections wait on the selector thread, not in workers: caps, evictions, framing, EMFILE.

An in-process server (the ``serve`` fixture) on loopback, with one or two
workers where the case is about workers, and the counters read from its
``/metrics`` as a scraper reads them. Waits are on sockets and events,
bounded; the one CPU reading (the accept loop under EMFILE) is a bound, not a
performance target.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.core import GaugeMetricFamily, Metric

from testkit.exposition import parse
from trainmon.core.collector import Collector
from trainmon.core.routes import PushRequest, PushResponse
from trainmon.http.connections import ACCEPT_BACKOFF_SECONDS
from trainmon.http.listen import HTTPConfig
from trainmon.http.server import ExporterHTTPServer
from trainmon.http.webconfig import TLSSettings, WebConfig

Serve = Callable[..., ExporterHTTPServer]
REFUSED = "trainmon_http_refused_connections_total"
EVICTED = "trainmon_http_evicted_connections_total"
TIMEOUTS = "trainmon_http_request_timeouts_total"


def counters(server: ExporterHTTPServer, family: str, label: str) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
    return {key[0]: value for key, value in parse(text).series(family, label).items()}


def connect(server: ExporterHTTPServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def response_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (EOF or reset) within its timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


class BlockingPush:
    """A push route whose handler holds its worker until ``release``; ``entered`` is
    released once per request that reached it."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self._release = threading.Event()

    def __call__(self, request: PushRequest) -> PushResponse:
        self.entered.release()
        self._release.wait(10)
        return PushResponse(202, {"ok": True})

    def release(self) -> None:
        self._release.set()


def test_a_full_server_closes_its_longest_waiting_connection_to_make_room(serve: Serve) -> None:
    server = serve(http=HTTPConfig(max_connections=2, max_connections_per_client=2))
    first, second = connect(server), connect(server)
    try:
        second.sendall(b"GET /metrics HTTP/1.1\r\n")  # arrived later, and still arriving
        answer = requests.get(f"http://127.0.0.1:{server.port}/healthz",
                              headers={"Connection": "close"}, timeout=5)
        assert answer.status_code == 200
        assert closed(first)  # waited longest: it made room
        second.sendall(b"Host: x\r\nConnection: close\r\n\r\n")
        assert response_of(second).startswith(b"HTTP/1.1 200")
    finally:
        first.close()
        second.close()
    assert counters(server, EVICTED, "reason")["max_connections_per_client"] >= 1
    assert counters(server, REFUSED, "reason")["max_connections_per_client"] == 0


def test_a_newcomer_gets_503_only_when_every_slot_is_being_answered(serve: Serve) -> None:
    push = BlockingPush()
    server = serve(http=HTTPConfig(max_connections=2, max_workers=2),
                   post_routes={"/api/v1/steps": push})
    answering = [connect(server), connect(server)]
    try:
        for sock in answering:
            sock.sendall(b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n{}")
        assert push.entered.acquire(timeout=5) and push.entered.acquire(timeout=5)
        with connect(server) as newcomer:  # no slot is waiting: none can make room
            newcomer.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            refused = response_of(newcomer)
        assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1\r\n" in refused
        push.release()
        for sock in answering:
            assert response_of(sock).startswith(b"HTTP/1.1 202")
    finally:
        push.release()
        for sock in answering:
            sock.close()
    assert counters(server, REFUSED, "reason")["max_connections"] == 1
    assert counters(server, EVICTED, "reason")["max_connections"] == 0


def test_requests_still_arriving_hold_no_worker(serve: Serve) -> None:
    server = serve(http=HTTPConfig(max_workers=1, header_timeout_seconds=30,
                                   read_timeout_seconds=30, max_connections_per_client=512))
    slow = [connect(server) for _ in range(200)]
    try:
        for index, sock in enumerate(slow):  # heads half sent, and bodies half sent
            if index % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: slow\r\n")
            else:
                sock.sendall(b"POST /api/v1/steps HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        for _ in range(10):
            started = time.monotonic()
            answer = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
            assert answer.status_code == 200
            assert time.monotonic() - started < 2
    finally:
        for sock in slow:
            sock.close()


def test_a_head_over_max_header_bytes_gets_431(serve: Serve) -> None:
    server = serve(http=HTTPConfig(max_header_bytes=1024))
    with connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Padding: " + b"a" * 2048 + b"\r\n\r\n")
        assert response_of(sock).startswith(b"HTTP/1.1 431")
    with connect(server) as sock:  # a head just within the limit is answered
        sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Padding: " + b"a" * 900
                     + b"\r\nConnection: close\r\n\r\n")
        assert response_of(sock).startswith(b"HTTP/1.1 200")
    assert counters(server, REFUSED, "reason")["max_header_bytes"] == 1


def test_bodies_arriving_share_a_budget_the_oldest_makes_room(serve: Serve) -> None:
    bodies: list[bytes] = []

    def handler(request: PushRequest) -> PushResponse:
        bodies.append(request.body)
        return PushResponse(202, {})

    server = serve(http=HTTPConfig(max_request_body_bytes=1024, max_buffered_body_bytes=2048),
                   post_routes={"/api/v1/steps": handler})
    # "100 Continue" says the server took the body's share of the budget
    head = (b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
            b"Expect: 100-continue\r\n\r\n")
    arriving = [connect(server) for _ in range(3)]
    try:
        for sock in arriving:
            sock.sendall(head)
            assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert closed(arriving[0])  # 2 × 1000 bytes fit the budget: the third's made room
        for fill, sock in zip(b"yz", arriving[1:], strict=True):
            sock.sendall(bytes([fill]) * 1000)
            assert sock.recv(4096).startswith(b"HTTP/1.1 202")
    finally:
        for sock in arriving:
            sock.close()
    assert bodies == [b"y" * 1000, b"z" * 1000]
    assert counters(server, EVICTED, "reason")["max_buffered_body_bytes"] == 1


def test_expect_100_continue_and_pipelined_requests(serve: Serve) -> None:
    server = serve(post_routes={"/api/v1/steps": lambda request: PushResponse(
        202, {"bytes": len(request.body)})})
    with connect(server) as sock:
        sock.sendall(b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        # the body, then two more requests in the same write
        sock.sendall(b"{}\n\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answers = response_of(sock)
    assert answers.startswith(b"HTTP/1.1 202") and b'{"bytes": 4}' in answers
    assert answers.count(b"HTTP/1.1 200 OK") == 2


def test_a_chunked_or_huge_body_is_answered_and_the_connection_closed(serve: Serve) -> None:
    server = serve(post_routes={"/api/v1/steps": lambda request: PushResponse(
        413 if request.too_large else 202, {})})
    with connect(server) as sock:
        sock.sendall(b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                     b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        answer = response_of(sock)  # ends: the chunks are not read as a request
    assert answer.startswith(b"HTTP/1.1 411") and answer.count(b"HTTP/1.1") == 1
    with connect(server) as sock:
        sock.sendall(b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999"
                     b"\r\n\r\n")
        assert response_of(sock).startswith(b"HTTP/1.1 413")


@pytest.fixture
def tls_server(serve: Serve, tls_files: dict[str, Path]) -> Iterator[
        tuple[ExporterHTTPServer, ssl.SSLContext]]:
    web = WebConfig(tls=TLSSettings(cert_file=tls_files["server.crt"],
                                    key_file=tls_files["server.key"]))
    server = serve(web=web, http=HTTPConfig(max_workers=1, header_timeout_seconds=1))
    yield server, ssl.create_default_context(cafile=str(tls_files["ca.crt"]))


def test_tls_handshakes_wait_without_a_worker_and_keep_alive_works(
    tls_server: tuple[ExporterHTTPServer, ssl.SSLContext],
) -> None:
    server, context = tls_server
    stalled = [connect(server) for _ in range(20)]  # never send a ClientHello
    try:
        with connect(server) as raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # two in one write
                        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answers = response_of(tls)
        assert answers.count(b"HTTP/1.1 200 OK") == 2
        assert all(closed(sock) for sock in stalled)  # cut at the header deadline
    finally:
        for sock in stalled:
            sock.close()
    timeouts = counters_tls(server, context)
    assert timeouts["handshake"] == 20


def counters_tls(server: ExporterHTTPServer, context: ssl.SSLContext) -> dict[str, float]:
    with connect(server) as raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = response_of(tls).partition(b"\r\n\r\n")[2].decode()
    return {key[0]: value for key, value in parse(text).series(TIMEOUTS, "phase").items()}


def failed_accepts(server: ExporterHTTPServer) -> float:
    """``…refused_connections_total{reason="fd_limit"}``, read in process: a scrape
    would need a file descriptor."""
    [refused] = [family for family in server.limits.collect() if family.name + "_total" == REFUSED]
    return next(sample.value for sample in refused.samples
                if sample.labels["reason"] == "fd_limit")


@contextlib.contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """This process out of file descriptors: the soft limit lowered to just above the
    descriptors open, and the rest filled with /dev/null; both undone on exit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    opened: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
    try:
        with contextlib.suppress(OSError):
            for _ in range(4096):
                opened.append(os.open("/dev/null", os.O_RDONLY))
        yield
    finally:
        for descriptor in opened:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_out_of_file_descriptors_the_accept_loop_backs_off_and_recovers(
    serve: Serve, caplog: pytest.LogCaptureFixture,
) -> None:
    server = serve()
    caplog.set_level(logging.WARNING, logger="trainmon.http.limits")
    client = socket.socket()  # its descriptor before there are none
    client.settimeout(5)
    try:
        with descriptors_exhausted():
            client.connect(("127.0.0.1", server.port))  # completes in the listen backlog
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            deadline = time.monotonic() + 5
            while failed_accepts(server) == 0:
                assert time.monotonic() < deadline, "accept() never failed"
                time.sleep(0.01)
            before, cpu, wall = failed_accepts(server), time.process_time(), time.monotonic()
            time.sleep(0.5)
            elapsed = time.monotonic() - wall
            cpu_share = (time.process_time() - cpu) / elapsed
            failures = failed_accepts(server)
        assert response_of(client).startswith(b"HTTP/1.1 200")  # accepted once fds are back
    finally:
        client.close()
    rate = (failures - before) / elapsed
    print(f"EMFILE: {rate:.1f} failed accepts a second, CPU {cpu_share:.0%} of a core")
    assert cpu_share < 0.2  # a busy loop would hold a whole core
    assert rate <= 1.5 / ACCEPT_BACKOFF_SECONDS  # one try per backoff, not thousands
    assert counters(server, REFUSED, "reason")["fd_limit"] >= failures
    logged = [r.getMessage() for r in caplog.records if "open-file limit" in r.getMessage()]
    assert len(logged) == 1, logged


class ManySeries(Collector):
    """An exposition of about 8 MB: more than loopback's socket buffers take for a client
    that never reads (about 3 MB here)."""

    name = "many"

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("example_padding", "Series to make a long answer.",
                                   labels=["index", "padding"])
        for index in range(30_000):
            family.add_metric([f"{index:08d}", "p" * 240], float(index))
        return [family]


def own_series(server: ExporterHTTPServer, name: str, label: str) -> dict[str, float]:
    """The server's own family ``name`` by ``label``, read in process (a scrape of this
    server's 4 MB exposition would be its own load)."""
    families = [*server.limits.collect(), *server.reception.collect()]
    [family] = [family for family in families
                if family.name == name or family.name + "_total" == name]
    return {sample.labels[label]: sample.value for sample in family.samples}


def wait_for(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def never_reading(server: ExporterHTTPServer) -> socket.socket:
    """A connection with a small receive buffer that asks for ``/metrics`` and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


def test_a_client_that_does_not_read_its_answer_holds_no_worker(serve: Serve) -> None:
    server = serve(collectors=[ManySeries()],
                   http=HTTPConfig(max_workers=1, read_timeout_seconds=3))
    stalled = never_reading(server)
    try:
        wait_for(lambda: own_series(server, "trainmon_http_connections", "state")["writing"] == 1,
                 10)
        for _ in range(5):  # the only worker is free: the answer waits on the selector
            answer = requests.get(f"http://127.0.0.1:{server.port}/healthz", timeout=2)
            assert answer.status_code == 200
        wait_for(lambda: own_series(server, TIMEOUTS, "phase")["response"] == 1, 10)
        assert own_series(server, "trainmon_http_connections", "state")["writing"] == 0
    finally:
        stalled.close()


def test_past_the_output_budget_the_worker_writes_under_the_deadline(serve: Serve) -> None:
    server = serve(collectors=[ManySeries()],
                   http=HTTPConfig(max_workers=1, read_timeout_seconds=1,
                                   max_buffered_response_bytes=64 << 10))
    stalled = never_reading(server)
    try:
        wait_for(lambda: own_series(server, TIMEOUTS, "phase")["response"] == 1, 10)
        assert own_series(server, "trainmon_http_connections", "state")["writing"] == 0
        answer = requests.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
        assert answer.status_code == 200  # the worker was given back at the deadline
        with connect(server) as reader:  # a client that reads gets the whole answer
            reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            whole = response_of(reader)
        assert whole.startswith(b"HTTP/1.1 200") and b'example_padding{index="00029999"' in whole
    finally:
        stalled.close()
