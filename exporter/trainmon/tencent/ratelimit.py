"""The account-wide request budget: one token bucket shared by every region.

Tencent Cloud limits ``GetMonitorData`` per account (20 requests per second in
the API reference), not per region or per process, so the puller keeps a
single bucket for all its API clients and stays below the limit by default
(15 requests per second).

The bucket is a GCRA ("virtual scheduling"): each caller reserves the next
free slot under a lock and then sleeps outside it until that slot. With the
default burst of 1 the requests are spaced exactly ``1 / rate`` apart, so no
one-second window — sliding or aligned — ever sees more than ``rate + 1``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Blocks each ``acquire()`` until the caller may send one request."""

    def __init__(
        self,
        rate: float,
        burst: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self._interval = 1.0 / rate
        self._tolerance = (burst - 1.0) * self._interval
        self._monotonic = monotonic
        self._sleep = sleep
        self._lock = threading.Lock()
        self._theoretical_arrival = float("-inf")
        self._waited = 0.0

    def acquire(self) -> float:
        """Reserve one request slot and sleep until it; returns the seconds waited."""
        with self._lock:
            now = self._monotonic()
            arrival = max(self._theoretical_arrival, now)
            start = max(now, arrival - self._tolerance)
            self._theoretical_arrival = arrival + self._interval
            wait = start - now
            self._waited += wait
        if wait > 0:
            self._sleep(wait)
        return wait

    @property
    def waited_seconds(self) -> float:
        """Total seconds callers have been held back (cumulative)."""
        with self._lock:
            return self._waited
