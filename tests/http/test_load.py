"""Load: /metrics keeps answering while 50 slow clients hold connections open.

Loopback only, bounded in count (50 holders, 30 scrapes) and time (~15 s).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import requests

from testkit.daemon import Daemon

SLOW_CLIENTS = 50
SCRAPES = 30


def hold_connection(port: int, stop: threading.Event, opened: list[socket.socket]) -> None:
    """Send a request one byte every 200 ms: alive, never finished."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    opened.append(sock)
    request = b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Padding: " + b"z" * 1000
    for byte in request:
        if stop.wait(0.2):
            break
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            break


def test_scrapes_answer_while_50_slow_clients_hold_connections(
    start_daemon: Callable[..., Daemon],
) -> None:
    # 50 slow clients and the scrapes share 127.0.0.1: lift the per-client cap and
    # the head deadline, which tests/security/test_slow_clients.py holds.
    daemon = start_daemon(config={"http": {"read_timeout_seconds": 30,
                                           "header_timeout_seconds": 30,
                                           "max_connections_per_client": 64}})
    stop = threading.Event()
    opened: list[socket.socket] = []
    holders = [
        threading.Thread(target=hold_connection, args=(daemon.port, stop, opened), daemon=True)
        for _ in range(SLOW_CLIENTS)
    ]
    for holder in holders:
        holder.start()
    try:
        deadline = time.monotonic() + 5
        while len(opened) < SLOW_CLIENTS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(opened) == SLOW_CLIENTS
        time.sleep(0.5)  # every holder has sent a few bytes and holds a server thread
        latencies = []
        with requests.Session() as session:
            for _ in range(SCRAPES):
                started = time.monotonic()
                response = session.get(daemon.url + "/metrics", timeout=5)
                latencies.append(time.monotonic() - started)
                assert response.status_code == 200
                assert "trainmon_collector_success" in response.text
        assert all(holder.is_alive() for holder in holders)  # still holding throughout
        latencies.sort()
        print(f"scrape latency under load: p50={latencies[len(latencies) // 2] * 1000:.1f} ms "
              f"max={latencies[-1] * 1000:.1f} ms")
        assert latencies[-1] < 2.0
    finally:
        stop.set()
        for sock in opened:
            sock.close()
        for holder in holders:
            holder.join(timeout=5)
    assert daemon.process.poll() is None
