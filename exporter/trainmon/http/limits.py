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
named under ``max_connections_per_client`` without taking (or even testing) a
global slot; one under its own limit that finds the server full is named
under ``max_connections``. ``admit`` only answers; what the server then does
(``trainmon.http.connections``: close a waiting connection to make room, or
refuse) it reports here, and that is counted.

``collect()`` gives the server's counters as metric families, every label
value present from the start with 0:

- ``trainmon_http_refused_connections_total{reason}``: ``max_connections``,
  ``max_connections_per_client`` (a 503 at accept: no connection was waiting
  to make room), ``max_header_bytes`` (a 431: the request head was too long),
  ``fd_limit`` (``accept()`` failed with EMFILE/ENFILE);
- ``trainmon_http_evicted_connections_total{reason}``: waiting connections
  closed to make room, by the limit reached (``max_connections``,
  ``max_connections_per_client``, ``max_buffered_body_bytes``);
- ``trainmon_http_request_timeouts_total{phase}``.

Refusals and evictions are logged at WARNING, at most once a minute per
reason, with the number held back since the line before.

``connection_budget`` fits ``http.max_connections`` under the process's
open-file limit, raising the soft limit first where the hard one allows.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Callable
from typing import Final, Literal

from trainmon.core.families import CounterMetricFamily, Metric
from trainmon.http.peer import ip_address_of
from trainmon.logthrottle import LogThrottle

log = logging.getLogger(__name__)

__all__ = [
    "EVICTION_REASONS",
    "REFUSAL_REASONS",
    "TIMEOUT_PHASES",
    "CapReason",
    "ConnectionLimits",
    "EvictionReason",
    "RefusalReason",
    "TimeoutPhase",
    "client_key",
    "connection_budget",
]

CapReason = Literal["max_connections", "max_connections_per_client"]
RefusalReason = Literal[
    "max_connections", "max_connections_per_client", "max_header_bytes", "fd_limit"
]
#: Values of the ``reason`` label of refusals: the limit a refused connection met.
REFUSAL_REASONS: Final[tuple[RefusalReason, ...]] = (
    "max_connections", "max_connections_per_client", "max_header_bytes", "fd_limit"
)
EvictionReason = Literal[
    "max_connections", "max_connections_per_client", "max_buffered_body_bytes"
]
#: Values of the ``reason`` label of evictions: the limit a new arrival met.
EVICTION_REASONS: Final[tuple[EvictionReason, ...]] = (
    "max_connections", "max_connections_per_client", "max_buffered_body_bytes"
)

TimeoutPhase = Literal["handshake", "head", "body", "response"]
#: The statuses a request head can be refused with before any route sees it
#: (``trainmon.http.framing.parse_head``; 501: a method no route answers).
BAD_REQUEST_CODES = ("400", "414", "431", "501", "505")
#: Values of the ``phase`` label: what was still in progress when the deadline ran out.
TIMEOUT_PHASES: Final[tuple[TimeoutPhase, ...]] = ("handshake", "head", "body", "response")

#: Spacing of the repeats of one refusal or eviction log line (seconds).
REFUSAL_LOG_INTERVAL_SECONDS = 60.0
#: File descriptors kept for everything but HTTP connections (the ledger, the step
#: socket, /proc and /sys reads, NVML, the log), at most: a quarter of a low limit.
FD_HEADROOM = 256


def client_key(host: str) -> str:
    """The address a connection from ``host`` counts against (see the module docstring).

    ``"::ffff:127.0.0.1"`` → ``"127.0.0.1"``; ``"fe80::1%eth0"`` → ``"fe80::1"``; a
    host that is not an IP address (never seen from a TCP socket) is its own key.
    """
    try:
        return str(ip_address_of(host))
    except ValueError:
        return host


def connection_budget(max_connections: int) -> int:
    """``max_connections`` as the open-file limit (``RLIMIT_NOFILE``) allows it.

    The soft limit is raised toward ``max_connections + FD_HEADROOM`` where the
    hard limit allows (as Go's runtime raises it for node_exporter); the answer
    then leaves ``FD_HEADROOM`` descriptors (a quarter of a lower limit) for
    everything else, and is at least 1. Logged at WARNING when it is lower than
    asked.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    wanted = max_connections + FD_HEADROOM
    if soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError) as error:
                log.debug("cannot raise RLIMIT_NOFILE to %d: %s", raised, error)
    budget = max(1, min(max_connections, soft - min(FD_HEADROOM, soft // 4)))
    if budget < max_connections:
        log.warning(
            "http.max_connections lowered from %d to %d: the open-file limit is %d "
            "(raise LimitNOFILE / ulimit -n to serve more)", max_connections, budget, soft)
    return budget


class ConnectionLimits:
    """The global and per-client connection caps, and the refusal, eviction and timeout counts.

    Thread-safe: ``admit``, ``refuse`` and ``evict`` run on the selector thread,
    ``release`` there and in workers, ``count_timeout`` on the selector thread
    and in workers, ``collect`` in a scrape.
    """

    def __init__(
        self,
        max_connections: int,
        max_connections_per_client: int,
        *,
        max_header_bytes: int = 16 << 10,
        max_buffered_body_bytes: int = 16 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_connections < 1 or max_connections_per_client < 1:
            raise ValueError("connection limits must be >= 1")
        self.max_connections = max_connections
        self.max_connections_per_client = max_connections_per_client
        self._values: dict[str, int] = {
            "max_connections": max_connections,
            "max_connections_per_client": max_connections_per_client,
            "max_header_bytes": max_header_bytes,
            "max_buffered_body_bytes": max_buffered_body_bytes,
        }
        self._open = 0
        self._open_by_client: dict[str, int] = {}
        self._refused: dict[RefusalReason, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self._evicted: dict[EvictionReason, int] = dict.fromkeys(EVICTION_REASONS, 0)
        self._timeouts: dict[TimeoutPhase, int] = dict.fromkeys(TIMEOUT_PHASES, 0)
        self._bad_requests = dict.fromkeys(BAD_REQUEST_CODES, 0)
        self._lock = threading.Lock()
        self._logged = LogThrottle(REFUSAL_LOG_INTERVAL_SECONDS, clock=clock)

    @property
    def open_connections(self) -> int:
        """Connections admitted and not yet released."""
        with self._lock:
            return self._open

    def admit(self, host: str) -> CapReason | None:
        """Take a slot for a new connection from ``host``: None if taken, else the cap
        that is full (nothing counted: the caller reports what it did about it with
        ``refuse`` or ``evict``). Each admitted connection is given back with
        ``release``, once."""
        key = client_key(host)
        with self._lock:
            held = self._open_by_client.get(key, 0)
            if held >= self.max_connections_per_client:
                return "max_connections_per_client"
            if self._open >= self.max_connections:
                return "max_connections"
            self._open += 1
            self._open_by_client[key] = held + 1
            return None

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

    def refuse(self, host: str, reason: RefusalReason) -> None:
        """A connection from ``host`` was refused at ``reason`` (counted, logged)."""
        with self._lock:
            self._refused[reason] += 1
        held_back = self._logged.admit(("refused", reason))
        if held_back is None:
            return
        if reason == "fd_limit":
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            log.warning("cannot accept connections: the open-file limit (%d) is reached; "
                        "accepting again in a moment; %s", soft, _repeats(held_back))
        elif reason == "max_header_bytes":
            log.warning("refused a request from %s: its head is longer than "
                        "http.max_header_bytes (%d); %s",
                        client_key(host), self._values[reason], _repeats(held_back))
        else:
            log.warning("refused a connection from %s: http.%s (%d) reached; %s",
                        client_key(host), reason, self._values[reason], _repeats(held_back))

    def evict(self, host: str, reason: EvictionReason) -> None:
        """A waiting connection from ``host`` was closed to make room at ``reason``."""
        with self._lock:
            self._evicted[reason] += 1
        held_back = self._logged.admit(("evicted", reason))
        if held_back is not None:
            log.warning("closed the longest-waiting connection from %s to make room: "
                        "http.%s (%d) reached; %s",
                        client_key(host), reason, self._values[reason], _repeats(held_back))

    def count_timeout(self, phase: TimeoutPhase) -> None:
        """A connection was closed because its deadline ran out during ``phase``."""
        with self._lock:
            self._timeouts[phase] += 1

    def count_bad_request(self, code: int) -> None:
        """A request head was answered ``code`` (``BAD_REQUEST_CODES``) and closed."""
        with self._lock:
            key = str(code)
            if key in self._bad_requests:
                self._bad_requests[key] += 1

    def collect(self) -> list[Metric]:
        """The four counters, with every reason, phase and code (0 until it happens)."""
        with self._lock:
            refused = dict(self._refused)
            evicted = dict(self._evicted)
            timeouts = dict(self._timeouts)
            bad_requests = dict(self._bad_requests)
        refused_family = CounterMetricFamily(
            "trainmon_http_refused_connections_total",
            "Connections the HTTP server refused, by the limit met: max_connections "
            "(http.max_connections, all clients) or max_connections_per_client "
            "(http.max_connections_per_client, one client IP address), an immediate 503 "
            "with Retry-After: 1 (with TLS: closed before the handshake) when no connection "
            "was waiting to make room; max_header_bytes (http.max_header_bytes), a 431 and "
            "a close; fd_limit, accept() failed for want of file descriptors "
            "(RLIMIT_NOFILE) and the server stopped accepting for 100 ms.",
            labels=["reason"],
        )
        for reason, count in refused.items():
            refused_family.add_metric([reason], float(count))
        evicted_family = CounterMetricFamily(
            "trainmon_http_evicted_connections_total",
            "Connections waiting for their request (still arriving, or idle keep-alive) "
            "that the HTTP server closed to make room, the longest-waiting first, by the "
            "limit a newcomer met: max_connections, max_connections_per_client (the "
            "newcomer's own address only) or max_buffered_body_bytes (request bodies held "
            "in memory while they arrive).",
            labels=["reason"],
        )
        for eviction, count in evicted.items():
            evicted_family.add_metric([eviction], float(count))
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
        bad_family = CounterMetricFamily(
            "trainmon_http_bad_requests_total",
            "Requests whose head the HTTP server refused before any route, answered and "
            "closed, by status: 400 (a request line or version that does not parse, an "
            "HTTP/0.9 request other than GET), 414 (a request line over 64 KiB), 431 (more "
            "than 100 header lines, one over 64 KiB), 501 (a method other than GET, HEAD "
            "and POST), 505 (HTTP/2 or later).",
            labels=["code"],
        )
        for code, count in bad_requests.items():
            bad_family.add_metric([code], float(count))
        return [refused_family, evicted_family, timeouts_family, bad_family]


def _repeats(held_back: int) -> str:
    if held_back:
        return f"{held_back} more since the last such line"
    return ("more are counted in trainmon_http_refused_connections_total and "
            "trainmon_http_evicted_connections_total and logged at most every "
            f"{REFUSAL_LOG_INTERVAL_SECONDS:g} s")
