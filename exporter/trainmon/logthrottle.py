"""Rate-limited logging of repeated errors: which occurrences of a log line get through.

A scrape every 15 s, a cloud pull every minute or a training step every few
milliseconds would otherwise repeat the same error line forever. Every place
that logs a recurring condition asks one ``LogThrottle`` first::

    if self._throttle.allow(path):
        log.debug("%s: cannot read", path)

Per key (a collector name, a path, an API action and error code...): the first
occurrence passes; a repeat passes again once ``interval_seconds`` has gone by
(never, with ``interval_seconds=None``: once per key), or at once when its
``detail`` (say, the error text) differs from the one that last passed.
``forget(key)`` says the condition has cleared, so the next occurrence passes.

Standard library only: ``trainmon.client`` imports it inside training processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

#: Default spacing of the repeats of one log line (seconds).
REPEAT_INTERVAL_SECONDS = 300.0


@dataclass
class _Passed:
    at: float
    detail: object
    held_back: int = 0


class LogThrottle:
    """Decides, per key, whether an occurrence of a recurring log line is logged.

    Thread-safe. At most ``max_keys`` keys are remembered; when a new key
    would exceed that, all are forgotten (memory stays bounded on hosts whose
    devices come and go; the cost is one more line per key).
    """

    def __init__(
        self,
        interval_seconds: float | None = REPEAT_INTERVAL_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 4096,
    ) -> None:
        self._interval = interval_seconds
        self._clock = clock
        self._max_keys = max_keys
        self._passed: dict[Hashable, _Passed] = {}
        self._lock = threading.Lock()

    def allow(self, key: Hashable, detail: object = None) -> bool:
        """True if this occurrence should be logged."""
        return self.admit(key, detail) is not None

    def admit(self, key: Hashable, detail: object = None) -> int | None:
        """``None`` if this occurrence stays quiet; else how many occurrences of
        ``key`` were held back since the last one that passed."""
        now = self._clock()
        with self._lock:
            last = self._passed.get(key)
            if last is None:
                if len(self._passed) >= self._max_keys:
                    self._passed.clear()
                self._passed[key] = _Passed(now, detail)
                return 0
            due = self._interval is not None and now - last.at >= self._interval
            if due or detail != last.detail:
                held_back = last.held_back
                self._passed[key] = _Passed(now, detail)
                return held_back
            last.held_back += 1
            return None

    def forget(self, key: Hashable) -> bool:
        """The condition behind ``key`` cleared; True if an occurrence of it had been logged."""
        with self._lock:
            return self._passed.pop(key, None) is not None
