"""Who may hold one of the HTTP server's connections, and the counts of what the limits cut.

``ConnectionLimits`` admits a new connection only when both caps allow it:

- ``http.max_connections_per_client``: connections open at once from one
  client address. Addresses are compared as IP addresses: an IPv4-mapped
  IPv6 address (``::ffff:10.0.0.1``, what a dual-stack ``[::]`` listener
  reports for IPv4 clients) is its IPv4 address, and an IPv6 scope
  (``%eth0``) is dropped. Each IPv6 address is its own client (no /64
  grouping): the global cap stays the backstop against a client with many
  addresses.
- ``http.max_connections``: connections open at once, all clients together.

The per-client cap is checked first, so a client over its own limit is
refused without taking (or even testing) a global slot, and the refusal is
counted under ``max_connections_per_client``; one under its own limit that
finds the server full is counted under ``max_connections``.

The server also reports here every connection it closed because a deadline
ran out (``count_timeout``). ``collect()`` gives both counters as metric
families, every label value present from the start with 0:

- ``trainmon_http_refused_connections_total{reason}``;
- ``trainmon_http_request_timeouts_total{phase}``.

Refusals are logged at WARNING, at most once a minute per reason, with the
number of refusals held back since the line before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final, Literal

from prometheus_client.core import CounterMetricFamily, Metric

from trainmon.http.peer import ip_address_of
from trainmon.logthrottle import LogThrottle

log = logging.getLogger(__name__)

__all__ = [
    "REFUSAL_REASONS",
    "TIMEOUT_PHASES",
    "ConnectionLimits",
    "RefusalReason",
    "TimeoutPhase",
    "client_key",
]

RefusalReason = Literal["max_connections", "max_connections_per_client"]
#: Values of the ``reason`` label: the cap a refused connection met (its config key in ``http:``).
REFUSAL_REASONS: Final[tuple[RefusalReason, ...]] = (
    "max_connections", "max_connections_per_client"
)

TimeoutPhase = Literal["handshake", "head", "body", "response"]
#: Values of the ``phase`` label: what was still in progress when the deadline ran out.
TIMEOUT_PHASES: Final[tuple[TimeoutPhase, ...]] = ("handshake", "head", "body", "response")

#: Spacing of the repeats of one refusal log line (seconds).
REFUSAL_LOG_INTERVAL_SECONDS = 60.0


def client_key(host: str) -> str:
    """The address a connection from ``host`` counts against (see the module docstring).

    ``"::ffff:127.0.0.1"`` → ``"127.0.0.1"``; ``"fe80::1%eth0"`` → ``"fe80::1"``; a
    host that is not an IP address (never seen from a TCP socket) is its own key.
    """
    try:
        return str(ip_address_of(host))
    except ValueError:
        return host


class ConnectionLimits:
    """The global and per-client connection caps, and the refusal and timeout counts.

    Thread-safe: ``admit`` runs in the accept loop, ``release`` and
    ``count_timeout`` in connection threads, ``collect`` in a scrape.
    """

    def __init__(
        self,
        max_connections: int,
        max_connections_per_client: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_connections < 1 or max_connections_per_client < 1:
            raise ValueError("connection limits must be >= 1")
        self.max_connections = max_connections
        self.max_connections_per_client = max_connections_per_client
        self._open = 0
        self._open_by_client: dict[str, int] = {}
        self._refused: dict[RefusalReason, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self._timeouts: dict[TimeoutPhase, int] = dict.fromkeys(TIMEOUT_PHASES, 0)
        self._lock = threading.Lock()
        self._refusals_logged = LogThrottle(REFUSAL_LOG_INTERVAL_SECONDS, clock=clock)

    def admit(self, host: str) -> RefusalReason | None:
        """Take a slot for a new connection from ``host``: None if taken, else the
        reason it was refused (counted and logged here). Each admitted
        connection is given back with ``release``, once."""
        key = client_key(host)
        reason: RefusalReason | None = None
        with self._lock:
            held = self._open_by_client.get(key, 0)
            if held >= self.max_connections_per_client:
                reason = "max_connections_per_client"
            elif self._open >= self.max_connections:
                reason = "max_connections"
            else:
                self._open += 1
                self._open_by_client[key] = held + 1
                return None
            self._refused[reason] += 1
        held_back = self._refusals_logged.admit(reason)
        if held_back is not None:
            limit = (
                self.max_connections_per_client
                if reason == "max_connections_per_client"
                else self.max_connections
            )
            repeats = (
                f"{held_back} more since the last such line" if held_back
                else "more are counted in trainmon_http_refused_connections_total and "
                f"logged at most every {REFUSAL_LOG_INTERVAL_SECONDS:g} s"
            )
            log.warning(
                "refused a connection from %s: http.%s (%d) reached; %s",
                key, reason, limit, repeats,
            )
        return reason

    def release(self, host: str) -> None:
        """Give back the slot an admitted connection from ``host`` held."""
        key = client_key(host)
        with self._lock:
            held = self._open_by_client.get(key, 0)
            if held <= 0:
                raise RuntimeError(f"release without admit for {key}")
            self._open -= 1
            if held == 1:
                del self._open_by_client[key]  # the map holds only clients with connections
            else:
                self._open_by_client[key] = held - 1

    def count_timeout(self, phase: TimeoutPhase) -> None:
        """A connection was closed because its deadline ran out during ``phase``."""
        with self._lock:
            self._timeouts[phase] += 1

    def collect(self) -> list[Metric]:
        """The two counters, with every reason and phase (0 until it happens)."""
        with self._lock:
            refused = dict(self._refused)
            timeouts = dict(self._timeouts)
        refused_family = CounterMetricFamily(
            "trainmon_http_refused_connections_total",
            "Connections the HTTP server refused at accept: an immediate 503 with "
            "Retry-After: 1 (plain HTTP; with TLS the connection is closed before the "
            "handshake), no request read. reason is the cap reached: max_connections "
            "(http.max_connections, all clients together) or max_connections_per_client "
            "(http.max_connections_per_client, one client IP address).",
            labels=["reason"],
        )
        for reason, count in refused.items():
            refused_family.add_metric([reason], float(count))
        timeouts_family = CounterMetricFamily(
            "trainmon_http_request_timeouts_total",
            "Connections the HTTP server closed because a deadline ran out, by phase: "
            "handshake (TLS) and head (request line and headers; a new connection that sends "
            "nothing counts, an idle keep-alive connection does not) under "
            "http.header_timeout_seconds; body (the whole request) and response (a client not "
            "reading its answer) under http.read_timeout_seconds.",
            labels=["phase"],
        )
        for phase, count in timeouts.items():
            timeouts_family.add_metric([phase], float(count))
        return [refused_family, timeouts_family]
