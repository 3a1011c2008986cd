"""One named daemon thread that runs a loop until it is told to stop.

The continuous work of the daemon (docs/architecture.md: GPU utilization sampling, XID
events, the training socket, the cloud puller, the demo node's files) each
runs in its own ``BackgroundThread``: ``start()`` launches ``run`` once,
``run`` loops until ``stopping`` is set (waiting on it rather than sleeping,
so that ``stop()`` returns within one wait), and ``stop()`` sets the event and
joins the thread for at most ``timeout`` seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundThread:
    """``BackgroundThread("gpu-sampler", loop)``: a restartable daemon thread running ``loop``."""

    def __init__(self, name: str, run: Callable[[], None]) -> None:
        self.name = name
        self._run = run
        #: Set by ``stop()``; the loop checks or waits on it.
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        """True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        """True from ``start()`` until ``stop()``."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread; nothing if it is already started."""
        if self._thread is not None:
            return
        self.stopping.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to end and wait for it at most ``timeout`` seconds; safe to call twice."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
