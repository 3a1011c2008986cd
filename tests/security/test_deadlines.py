"""Total deadlines on every outbound request, and a bounded ``Reporter.close()``.

Two loopback fakes stand in for a misbehaving server: ``SilentServer`` accepts
connections and never answers; ``TrickleServer`` answers a well-formed HTTP
response one byte at a time (the measured case: the metadata service sending a
byte every 0.5 s held a poll with a 1 s per-read timeout for 30.6 s). Each
client must give up at its deadline, whatever the pace. The assertions are
bounds (deadline + a margin for a loaded machine), not performance targets.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import pytest

from testkit.daemon import free_port
from testkit.loopback import LoopbackHTTPServer, Reply, Request
from trainmon import outbound
from trainmon.attribution.kubelet import KubeletPodDirectory
from trainmon.client import Reporter
from trainmon.client.reporter import CLOSE_TIMEOUT_SECONDS
from trainmon.client.transport import (
    FULL_QUEUE_RETRY_BUDGET_SECONDS,
    HTTP_TIMEOUT_SECONDS,
    open_sender,
)
from trainmon.tencent.client import MONITOR, APIError, APIStats, TencentAPI
from trainmon.tencent.credentials import Credential, CredentialsUnavailable, MetadataService
from trainmon.tencent.metadata import HTTPTransport, MetadataError, TencentMetadata
from trainmon.tencent.ratelimit import TokenBucket

#: Slack for a loaded 2-core machine on top of a deadline (seconds).
MARGIN_SECONDS = 0.5
#: The trickle pace: one byte per this many seconds (a whole answer takes minutes).
TRICKLE_PAUSE_SECONDS = 0.05


Fake = TypeVar("Fake", bound="_TCPFake")


class _TCPFake:
    """A loopback TCP listener serving each connection on a daemon thread until ``stop``."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._connections: list[socket.socket] = []
        #: Set when a connection has been accepted (a client is waiting on us).
        self.connected = threading.Event()
        self.accepted = 0
        self._accept_thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self: Fake) -> Fake:
        self._accept_thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._accept_thread.join(5)
        for thread in self._threads:
            thread.join(5)
        for connection in self._connections:
            connection.close()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._connections.append(connection)
            self.accepted += 1
            self.connected.set()
            thread = threading.Thread(target=self.serve, args=(connection,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def serve(self, connection: socket.socket) -> None:
        raise NotImplementedError

    def stopped(self, seconds: float) -> bool:
        """Pace the fake: True once it is being stopped (ends its loops)."""
        return self._stop.wait(seconds)


class SilentServer(_TCPFake):
    """Accepts, reads what the client sends, and never answers."""

    def serve(self, connection: socket.socket) -> None:
        connection.settimeout(0.1)
        while not self.stopped(0.0):
            try:
                if not connection.recv(65536):
                    return
            except TimeoutError:
                continue
            except OSError:
                return


class TrickleServer(_TCPFake):
    """Answers every request with a valid HTTP response, one byte per ``pause`` seconds."""

    def __init__(self, body: bytes = b"ins-3g445roi", content_type: str = "text/plain",
                 pause: float = TRICKLE_PAUSE_SECONDS) -> None:
        super().__init__()
        self.answer = (
            f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nX-Padding: {'p' * 200}\r\n\r\n"
        ).encode() + body
        self.pause = pause

    def serve(self, connection: socket.socket) -> None:
        connection.settimeout(5)
        try:
            connection.recv(65536)  # the request (small: one read)
            for index in range(len(self.answer)):
                if self.stopped(self.pause):
                    return
                connection.sendall(self.answer[index:index + 1])
        except OSError:  # the client gave up and closed: what we expect
            return


@pytest.fixture
def trickle() -> Iterator[TrickleServer]:
    with TrickleServer() as server:
        yield server


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    with SilentServer() as server:
        yield server


def timed(call: Callable[[], object]) -> tuple[float, BaseException | None]:
    """Seconds ``call`` took, and what it raised."""
    started = time.monotonic()
    try:
        call()
    except Exception as error:  # the caller asserts on the type
        return time.monotonic() - started, error
    return time.monotonic() - started, None


# -- trainmon.outbound --------------------------------------------------------------


def test_a_trickling_answer_fails_at_the_deadline(trickle: TrickleServer) -> None:
    seconds, error = timed(lambda: outbound.request("GET", trickle.url + "/x", timeout=0.5))
    assert isinstance(error, outbound.OutboundError) and error.reason == "timeout", error
    assert 0.45 <= seconds <= 0.5 + MARGIN_SECONDS


def test_a_silent_server_fails_at_the_deadline(silent: SilentServer) -> None:
    seconds, error = timed(
        lambda: outbound.request("POST", silent.url + "/x", body=b"x" * 100, timeout=0.4))
    assert isinstance(error, outbound.OutboundError) and error.reason == "timeout", error
    assert seconds <= 0.4 + MARGIN_SECONDS


def test_a_complete_answer_with_its_headers_and_the_body_cap() -> None:
    seen: list[Request] = []

    def answer(request: Request) -> Reply:
        seen.append(request)
        return Reply.text("x" * 100)

    with LoopbackHTTPServer(answer) as server:
        response = outbound.request("POST", server.url + "/p?q=1", body=b"payload", timeout=2,
                                    headers={"Authorization": "Bearer t"})
        assert (response.status, response.body) == (200, b"x" * 100)
        assert response.header("content-type") == "text/plain; charset=utf-8"
        with pytest.raises(outbound.OutboundError) as caught:
            outbound.request("GET", server.url + "/", timeout=2, max_body_bytes=99)
        assert caught.value.reason == "too_large"
    assert (seen[0].method, seen[0].path, seen[0].body) == ("POST", "/p?q=1", b"payload")
    assert seen[0].headers["authorization"] == "Bearer t"


def test_nothing_listening_is_unreachable() -> None:
    with pytest.raises(outbound.OutboundError) as caught:
        outbound.request("GET", f"http://127.0.0.1:{free_port()}/", timeout=1)
    assert caught.value.reason == "unreachable"


# -- every daemon client ------------------------------------------------------------


def test_the_metadata_poller_gives_up_at_its_timeout(trickle: TrickleServer) -> None:
    metadata = TencentMetadata(HTTPTransport(trickle.url, 1.0), time.time)
    seconds, error = timed(metadata.instance_id)
    assert isinstance(error, MetadataError) and error.reason == "timeout", error
    assert seconds <= 1.0 + MARGIN_SECONDS


def test_cam_role_credentials_give_up_at_their_timeout(trickle: TrickleServer) -> None:
    metadata = MetadataService(trickle.url, timeout=0.5)
    seconds, error = timed(metadata.role_name)
    assert isinstance(error, CredentialsUnavailable) and "Timeout" in str(error), error
    assert seconds <= 0.5 + MARGIN_SECONDS


class _Key:
    source = "test"

    def credential(self) -> Credential:
        return Credential("AKIDtest", "key")

    def invalidate(self) -> None:
        pass


def test_a_tencent_api_attempt_gives_up_at_its_timeout(trickle: TrickleServer) -> None:
    stats = APIStats()
    api = TencentAPI(trickle.url, _Key(), limiter=TokenBucket(100.0), stats=stats,
                     timeout=0.5, max_retries=0)
    seconds, error = timed(lambda: api.call(MONITOR, "GetMonitorData", {}, "ap-shanghai"))
    assert isinstance(error, APIError) and error.code == "Timeout", error
    assert seconds <= 0.5 + MARGIN_SECONDS
    assert stats.snapshot().errors == {("GetMonitorData", "Timeout"): 1}


def test_the_kubelet_pod_list_gives_up_at_its_timeout(trickle: TrickleServer) -> None:
    pods = KubeletPodDirectory(trickle.url, timeout_seconds=0.5)
    seconds, error = timed(lambda: pods.lookup("uid"))
    assert error is None and seconds <= 0.5 + MARGIN_SECONDS
    assert pods.fetches == {"ok": 0, "error": 1}
    assert "no complete answer within 0.5 s" in (pods.last_error or "")


# -- the training client ------------------------------------------------------------


@pytest.mark.parametrize("server", [SilentServer, TrickleServer])
def test_an_http_delivery_gives_up_at_http_timeout(server: type[_TCPFake]) -> None:
    with server() as fake:
        sender = open_sender(fake.url, "token-for-the-test")
        seconds, error = timed(lambda: sender.send(b"{}\n"))
        assert error is None and "no complete answer" in sender.last_error
        assert seconds <= HTTP_TIMEOUT_SECONDS + MARGIN_SECONDS


@pytest.mark.parametrize("server", [SilentServer, TrickleServer])
def test_close_returns_within_its_bound_against_a_server_that_does_not_answer(
    server: type[_TCPFake],
) -> None:
    with server() as fake:
        reporter = Reporter("unit", endpoint=fake.url, environ={}, interval_seconds=0.05)
        reporter.step()
        assert fake.connected.wait(10)  # the sender thread's delivery is in flight
        seconds, error = timed(reporter.close)
        assert error is None
        assert seconds <= CLOSE_TIMEOUT_SECONDS + MARGIN_SECONDS, seconds
        assert reporter.dropped_reports >= 1


def test_close_delivers_the_totals_and_the_ended_description_in_one_payload() -> None:
    bodies: list[bytes] = []

    def answer(request: Request) -> Reply:
        bodies.append(request.body)
        return Reply.json({})

    with LoopbackHTTPServer(answer) as server:
        reporter = Reporter("unit", endpoint=server.url, environ={}, interval_seconds=60)
        reporter.step(samples=2)
        reporter.close()
    assert len(bodies) == 1  # nothing was sent before close(): one payload, two lines
    lines = bodies[0].splitlines()
    assert len(lines) == 2
    assert b'"samples":2' in lines[0] and b'"ended":"finished"' in lines[1]
    assert reporter.dropped_reports == 0


def test_the_http_sender_sends_its_token() -> None:
    seen: list[Request] = []

    def answer(request: Request) -> Reply:
        seen.append(request)
        return Reply.json({})

    with LoopbackHTTPServer(answer) as server:
        sender = open_sender(server.url, "s3cret-token-0123")
        assert sender.send(b"{}\n")
    assert (seen[0].path, seen[0].headers["authorization"]) == (
        "/api/v1/steps", "Bearer s3cret-token-0123")


def test_the_protocol_page_states_the_client_bounds() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    assert f"`CLOSE_TIMEOUT_SECONDS` = **{CLOSE_TIMEOUT_SECONDS:g} s**" in text
    assert f"`HTTP_TIMEOUT_SECONDS` = {HTTP_TIMEOUT_SECONDS:g} s" in text
    assert f"`FULL_QUEUE_RETRY_BUDGET_SECONDS` = **{FULL_QUEUE_RETRY_BUDGET_SECONDS:g} s**" in text


def test_a_tls_handshake_that_never_comes_fails_at_the_deadline(silent: SilentServer) -> None:
    url = silent.url.replace("http://", "https://")
    seconds, error = timed(lambda: outbound.request("GET", url + "/", timeout=0.4))
    assert isinstance(error, outbound.OutboundError) and error.reason == "timeout", error
    assert seconds <= 0.4 + MARGIN_SECONDS
