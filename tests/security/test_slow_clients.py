"""Slow and many clients cannot starve scrapes; the read routes sit behind basic auth.

A real ``trainmon serve`` on loopback, with short limits so that every case
takes seconds:

- the same-address probe of issue 35: 1 000 connections from 127.0.0.1 each
  trickle a header line a second while a scraper, also on 127.0.0.1, opens a
  fresh connection per scrape once a second (2 s timeout): at least 95 % of
  scrapes answer 200, at the default caps;
- one attacker address (127.0.0.1) keeps 200 slow connections going against
  caps of 64 and 16 while a scraper on another address (127.0.0.2: the whole
  of 127/8 is loopback) scrapes ``/metrics``: the attacker's connections make
  room for each other, never take the scraper's;
- a slow request head is cut at ``http.header_timeout_seconds``, a slow body
  at ``http.read_timeout_seconds``.

Every loop is bounded and every socket closed; waits are on sockets, events and
the daemon process, not sleeps. ``ConnectionLimits`` is also checked alone.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import resource
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from testkit.daemon import READY_TIMEOUT_SECONDS, Daemon
from testkit.exposition import Scrape, parse
from trainmon.http.limits import ConnectionLimits, client_key

#: Everything that reads the node or the network off: the daemon serves little but itself.
QUIET_COLLECTORS: dict[str, object] = {
    name: {"enabled": False}
    for name in ("gpu", "network", "infiniband", "disk", "numa", "nfs", "platform",
                 "attribution", "pressure", "diagnosis", "health")
}
ATTACKER = "127.0.0.1"
SCRAPER = "127.0.0.2"
SLOW_CONNECTIONS = 200
PER_CLIENT = 16
#: The scraper scrapes this often per attacker round, for ATTACKED_ROUNDS rounds.
SCRAPES_PER_ROUND = 15
ATTACKED_ROUNDS = 16
#: The attacker sends one header line per connection this often (seconds).
TRICKLE_SECONDS = 0.25
#: The same-address probe: slow connections, scrapes (one a second, each on a fresh
#: connection, given SAME_ADDRESS_TIMEOUT seconds) and the share that must answer.
SAME_ADDRESS_CONNECTIONS = 1000
SAME_ADDRESS_SCRAPES = 20
SAME_ADDRESS_TIMEOUT = 2.0
SAME_ADDRESS_ANSWERED = 0.95
REFUSED = "trainmon_http_refused_connections_total"
EVICTED = "trainmon_http_evicted_connections_total"
TIMEOUTS = "trainmon_http_request_timeouts_total"


def scrape_from(daemon: Daemon, source: str, path: str = "/metrics",
                timeout: float = 10.0) -> tuple[int, str]:
    """GET ``path`` on a fresh connection bound to the loopback address ``source``."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", daemon.port, timeout=timeout, source_address=(source, 0)
    )
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def metrics(daemon: Daemon) -> Scrape:
    status, body = scrape_from(daemon, SCRAPER)
    assert status == 200, body
    return parse(body)


def attack(port: int, stop: threading.Event, rounds: threading.Semaphore) -> None:
    """Keep ``SLOW_CONNECTIONS`` connections from ``ATTACKER``, each sending one
    header line per ``TRICKLE_SECONDS`` and never ending its head; a connection
    the server closes is opened again on the next round. Releases ``rounds``
    after each round; stops at ``stop`` (at most 240 rounds, a minute); closes
    every socket it opened."""
    slots: list[socket.socket | None] = [None] * SLOW_CONNECTIONS
    try:
        for _ in range(240):
            for index, sock in enumerate(slots):
                try:
                    if sock is None:
                        sock = socket.create_connection(
                            ("127.0.0.1", port), timeout=1, source_address=(ATTACKER, 0)
                        )
                        slots[index] = sock
                        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: slow\r\n")
                    else:
                        sock.sendall(b"X-Slow: 1\r\n")
                except OSError:  # refused (503 and closed) or cut at the header deadline
                    if sock is not None:
                        sock.close()
                    slots[index] = None
            rounds.release()
            if stop.wait(TRICKLE_SECONDS):
                return
    finally:
        for sock in slots:
            if sock is not None:
                sock.close()


def closed_after(sock: socket.socket, limit: float, tick: bytes | None = None) -> float:
    """Seconds until the server closes ``sock`` (at most ``limit``), sending ``tick``
    every 0.2 s meanwhile. Fails if the server answers anything."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < limit:
        try:
            data = sock.recv(1024)
        except TimeoutError:
            if tick is not None:
                try:
                    sock.sendall(tick)
                except OSError:
                    return time.monotonic() - started
            continue
        except ConnectionResetError:
            return time.monotonic() - started
        assert data == b"", f"expected a close without an answer, got {data!r}"
        return time.monotonic() - started
    raise AssertionError(f"the connection was still open after {limit} s")


def open_slow() -> socket.socket:
    """A non-blocking connection from ``ATTACKER``, still connecting."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((ATTACKER, 0))
    sock.setblocking(False)
    return sock


def ended_by_server(sock: socket.socket) -> bool:
    """Whether the server closed (or answered) ``sock``; False while it is quiet."""
    try:
        sock.recv(4096)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def trickle(port: int, count: int, stop: threading.Event, opened: threading.Event) -> None:
    """``count`` connections from ``ATTACKER``, each sending one header line a second and
    never ending its head; one the server closes is opened again at the next second.
    Sets ``opened`` once all have been opened; stops at ``stop`` (two minutes at most)
    and closes every socket it opened."""
    sockets = [open_slow() for _ in range(count)]
    for sock in sockets:
        sock.connect_ex(("127.0.0.1", port))  # EINPROGRESS: the first send waits for it
    begun = [False] * count
    opened.set()
    try:
        for tick in range(120):
            for index, sock in enumerate(sockets):
                line = b"X-Slow-%d: a\r\n" % tick if begun[index] else b"GET / HTTP/1.1\r\n"
                try:
                    if ended_by_server(sock):
                        raise ConnectionResetError
                    sock.send(line)
                    begun[index] = True
                except BlockingIOError:  # still connecting
                    continue
                except OSError:
                    sock.close()
                    sockets[index] = sock = open_slow()
                    sock.connect_ex(("127.0.0.1", port))
                    begun[index] = False
            if stop.wait(1.0):
                return
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.integration
def test_1000_slow_connections_from_the_scraper_s_own_address_cannot_starve_it(
    start_daemon: Callable[..., Daemon],
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * SAME_ADDRESS_CONNECTIONS
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} open files, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    daemon = start_daemon(config={"collectors": QUIET_COLLECTORS})  # the default caps
    stop, opened = threading.Event(), threading.Event()
    attacker = threading.Thread(target=trickle, daemon=True,
                                args=(daemon.port, SAME_ADDRESS_CONNECTIONS, stop, opened))
    attacker.start()
    statuses: list[int] = []
    try:
        assert opened.wait(30), "the attacker did not get going"
        for _ in range(SAME_ADDRESS_SCRAPES):
            started = time.monotonic()
            try:
                statuses.append(scrape_from(daemon, ATTACKER, timeout=SAME_ADDRESS_TIMEOUT)[0])
            except OSError:
                statuses.append(0)
            stop.wait(max(0.0, started + 1.0 - time.monotonic()))
        evicted = metrics_from(daemon, ATTACKER).series(EVICTED, "reason")
    finally:
        stop.set()
        attacker.join(timeout=10)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not attacker.is_alive()
    ok = statuses.count(200)
    print(f"same address: {ok}/{len(statuses)} scrapes answered 200 beside "
          f"{SAME_ADDRESS_CONNECTIONS} slow connections; evicted: {evicted}")
    assert ok >= SAME_ADDRESS_ANSWERED * len(statuses), statuses
    # the attack held the address's whole share: its connections made room for each other
    assert evicted[("max_connections_per_client",)] >= SAME_ADDRESS_CONNECTIONS - 256
    assert daemon.process.poll() is None


def metrics_from(daemon: Daemon, source: str) -> Scrape:
    """The daemon's ``/metrics`` from ``source``, tried until it answers (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            status, body = scrape_from(daemon, source, timeout=2)
        except OSError:
            status, body = 0, ""
        if status == 200:
            return parse(body)
        assert time.monotonic() < deadline, (status, body)


@pytest.mark.integration
def test_one_address_with_200_slow_connections_cannot_starve_another_s_scrapes(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon(config={
        "http": {"max_connections": 64, "max_connections_per_client": PER_CLIENT,
                 "header_timeout_seconds": 1, "read_timeout_seconds": 5},
        "collectors": QUIET_COLLECTORS,
    })
    before = metrics(daemon)
    assert set(before.series(REFUSED, "reason").values()) == {0.0}
    assert before.series(EVICTED, "reason") == {
        ("max_connections",): 0.0, ("max_connections_per_client",): 0.0,
        ("max_buffered_body_bytes",): 0.0,
    }
    assert before.series(TIMEOUTS, "phase") == {
        ("handshake",): 0.0, ("head",): 0.0, ("body",): 0.0, ("response",): 0.0,
    }

    stop, rounds = threading.Event(), threading.Semaphore(0)
    attacker = threading.Thread(target=attack, args=(daemon.port, stop, rounds), daemon=True)
    attacker.start()
    statuses: list[int] = []
    try:
        assert rounds.acquire(timeout=10), "the attacker did not get going"
        started = time.monotonic()
        for _ in range(ATTACKED_ROUNDS):  # in step with the attack, for several header deadlines
            assert rounds.acquire(timeout=10), "the attacker stalled"
            for _ in range(SCRAPES_PER_ROUND):
                try:
                    statuses.append(scrape_from(daemon, SCRAPER)[0])
                except OSError:
                    statuses.append(0)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        attacker.join(timeout=10)
    assert not attacker.is_alive()

    after = metrics(daemon)
    refused = after.series(REFUSED, "reason")
    evicted = after.series(EVICTED, "reason")
    ok = statuses.count(200)
    print(f"{ok}/{len(statuses)} scrapes answered 200 in {elapsed:.1f} s under attack; "
          f"refused: {refused}; evicted: {evicted}")
    assert len(statuses) == ATTACKED_ROUNDS * SCRAPES_PER_ROUND
    assert ok >= 0.99 * len(statuses), statuses
    # The attacker met its own cap again and again: its newest connections closed its
    # oldest ones; it never filled the server, and nobody was refused.
    assert evicted[("max_connections_per_client",)] >= SLOW_CONNECTIONS
    assert evicted[("max_connections",)] == 0
    assert set(refused.values()) == {0.0}
    assert "http.max_connections_per_client (16) reached" in daemon.log()
    assert daemon.process.poll() is None


@pytest.mark.integration
def test_a_slow_head_is_cut_at_the_header_deadline_a_slow_body_at_the_request_deadline(
    start_daemon: Callable[..., Daemon],
) -> None:
    header_timeout, read_timeout = 1.0, 3.0
    daemon = start_daemon(config={
        "http": {"header_timeout_seconds": header_timeout, "read_timeout_seconds": read_timeout},
        "collectors": QUIET_COLLECTORS,
    })

    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: slow\r\n")
        head = closed_after(sock, header_timeout + 3, tick=b"X-Slow: 1\r\n")
    assert header_timeout - 0.1 <= head < header_timeout + 1.5

    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        idle = closed_after(sock, header_timeout + 3)
    assert header_timeout - 0.1 <= idle < header_timeout + 1.5

    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
        sock.sendall(b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        body = closed_after(sock, read_timeout + 3, tick=b"{")
    assert read_timeout - 0.1 <= body < read_timeout + 1.5

    timeouts = metrics(daemon).series(TIMEOUTS, "phase")
    print(f"closed after: head {head:.2f} s, idle keep-alive {idle:.2f} s, body {body:.2f} s")
    # The idle keep-alive connection was closed, but it is no timeout.
    assert timeouts == {("handshake",): 0.0, ("head",): 1.0, ("body",): 1.0, ("response",): 0.0}


def read_response(sock: socket.socket) -> bytes:
    """One whole response (head and ``Content-Length`` body) from ``sock``."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    [length] = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")]
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, received
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.integration
def test_the_run_routes_sit_behind_basic_auth(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {hashed}\n")
    daemon = start_daemon(
        config={"web_config_file": str(web), "collectors": QUIET_COLLECTORS}, wait=False
    )
    good = {"Authorization": "Basic " + b64encode(b"prometheus:s3cret").decode()}
    wrong = {"Authorization": "Basic " + b64encode(b"prometheus:wrong").decode()}
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while not ready(daemon, good):
        assert time.monotonic() < deadline, daemon.log()
        with contextlib.suppress(subprocess.TimeoutExpired):  # ready() reports an exit
            daemon.process.wait(0.1)

    for path in ("/metrics", "/api/v1/runs", "/api/v1/runs?job=bert", "/api/v1/runs/run-a"):
        status, _ = daemon.get(path)
        assert status == 401, path
        assert daemon.get(path, wrong)[0] == 401, path
    assert daemon.get("/metrics", good)[0] == 200
    status, body = daemon.get("/api/v1/runs", good)
    assert (status, json.loads(body)) == (200, [])
    assert daemon.get("/api/v1/runs/run-a", good)[0] == 404


def ready(daemon: Daemon, headers: dict[str, str]) -> bool:
    """Whether the daemon answers ``/healthz`` with these credentials."""
    assert daemon.process.poll() is None, daemon.log()
    try:
        return daemon.get("/healthz", headers)[0] == 200
    except (urllib.error.URLError, OSError):
        return False


# -- ConnectionLimits alone ------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::ffff:127.0.0.1", "127.0.0.1"),  # a dual-stack [::] listener's IPv4 client
        ("::FFFF:10.1.2.3", "10.1.2.3"),
        ("fe80::1%eth0", "fe80::1"),
        ("2001:db8:0:0::1", "2001:db8::1"),
    ],
)
def test_clients_are_counted_by_ip_address(host: str, key: str) -> None:
    assert client_key(host) == key


def test_the_per_client_cap_is_met_without_taking_a_global_slot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    limits = ConnectionLimits(3, 2, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="trainmon.http.limits")
    assert limits.admit("10.0.0.1") is None
    assert limits.admit("::ffff:10.0.0.1") is None  # the same client
    for _ in range(5):
        assert limits.admit("10.0.0.1") == "max_connections_per_client"
        limits.refuse("10.0.0.1", "max_connections_per_client")
    assert limits.admit("10.0.0.2") is None  # meeting the per-client cap took no global slot
    assert limits.admit("10.0.0.3") == "max_connections"
    limits.refuse("10.0.0.3", "max_connections")
    limits.release("::ffff:10.0.0.1")
    assert limits.admit("10.0.0.3") is None
    assert limits.admit("10.0.0.1") == "max_connections"  # under its own cap, server full
    limits.evict("10.0.0.2", "max_connections")
    assert limits.open_connections == 3

    samples = parse_families(limits)
    assert samples[REFUSED] == {"max_connections": 1.0, "max_connections_per_client": 5.0,
                                "max_header_bytes": 0.0, "fd_limit": 0.0}
    assert samples[EVICTED] == {"max_connections": 1.0, "max_connections_per_client": 0.0,
                                "max_buffered_body_bytes": 0.0}
    assert samples[TIMEOUTS] == {"handshake": 0.0, "head": 0.0, "body": 0.0, "response": 0.0}
    # One line per reason while the refusals repeat within the log interval.
    logged = [record.getMessage() for record in caplog.records]
    assert len(logged) == 3
    assert "from 10.0.0.1: http.max_connections_per_client (2) reached" in logged[0]
    assert "from 10.0.0.3: http.max_connections (3) reached" in logged[1]
    assert "closed the longest-waiting connection from 10.0.0.2" in logged[2]
    now[0] += 61  # past the log interval: the next refusal is logged with the held-back count
    limits.refuse("10.0.0.9", "max_connections_per_client")
    assert "4 more since the last such line" in caplog.records[-1].getMessage()


def parse_families(limits: ConnectionLimits) -> dict[str, dict[str, float]]:
    """``collect()`` samples by name, keyed by their one label's value."""
    result: dict[str, dict[str, float]] = {}
    for family in limits.collect():
        for sample in family.samples:
            result.setdefault(sample.name, {})[next(iter(sample.labels.values()))] = sample.value
    return result
