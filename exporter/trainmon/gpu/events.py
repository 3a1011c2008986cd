"""XID critical-error events: an NVML event set and the thread that waits on it.

An XID is the driver's report of a GPU fault (13: graphics exception, 48:
double-bit ECC, 79: fell off the bus, ...). It is an *event*, not a reading:
a scrape every 15 s would miss it, so ``XidListener`` registers every
reachable GPU for ``nvmlEventTypeXidCriticalError`` in one NVML event set
(``XidSubscription``) and blocks in ``nvmlEventSetWait_v2`` from its own
thread, counting each event per (GPU, XID code) with its time: kept on the steady
time (``trainmon.clock``) and shown as the wall clock reckons it at each read, so
that the wall clock less it is the event's age also after the wall clock stepped
(what "recent" means to the GPU collector and the health rules).
Every NVML call goes through the facade's chokepoint (``NVML.query``); a lost
session (driver reload) ends the subscription and the listener subscribes
again once NVML is back. Drivers without events leave the listener
"unsupported" and the XID series empty (docs/metrics.md, "GPU": none lost, none invented).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainmon.background import BackgroundThread
from trainmon.clock import WallSteps
from trainmon.gpu.nvml import (
    ERROR_TIMEOUT,
    EVENT_XID_CRITICAL_ERROR,
    NVML,
    NVMLSession,
    error_code,
    error_name,
)
from trainmon.gpu.types import GPULost, NVMLUnavailable

log = logging.getLogger(__name__)

#: How long ``XidListener`` blocks in ``nvmlEventSetWait`` (bounds ``stop()``).
XID_WAIT_MS = 500
REGISTER = "nvmlDeviceRegisterEvents"


@dataclass(frozen=True)
class XidEvent:
    gpu: int
    xid: int


@dataclass(frozen=True)
class XidCount:
    count: int
    last_timestamp_seconds: float


class XidSubscription:
    """XID critical-error events of the GPUs registered in one event set."""

    WAIT = "nvmlEventSetWait_v2"

    def __init__(
        self, nvml: NVML, session: NVMLSession, event_set: Any, gpus: Mapping[object, int]
    ) -> None:
        self._nvml = nvml
        self._session = session
        self._event_set = event_set
        self._gpus = dict(gpus)

    @classmethod
    def open(cls, nvml: NVML) -> XidSubscription | None:
        """An event set with every reachable GPU registered for XID critical
        errors, or None when the driver cannot deliver events."""
        session = nvml.session()
        library = nvml.library
        event_set = nvml.query(None, library.nvmlEventSetCreate, session=session)
        if event_set is None:
            return None
        gpus: dict[object, int] = {}
        for index, handle in enumerate(session.handles):
            if handle is None or index in session.lost_since:
                continue
            failed: list[str] = []
            try:
                nvml.query(
                    index,
                    library.nvmlDeviceRegisterEvents,
                    handle,
                    EVENT_XID_CRITICAL_ERROR,
                    event_set,
                    session=session,
                    failed=failed,
                )
            except GPULost:
                continue
            # None means success, unsupported or an unexpected error alike.
            if not failed and nvml.supports(index, REGISTER):
                gpus[_handle_key(handle)] = index
        return cls(nvml, session, event_set, gpus)

    @property
    def usable(self) -> bool:
        """False when the driver cannot wait for events (too old) or no GPU is registered."""
        return bool(self._gpus) and not self._nvml.is_missing(self.WAIT)

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """The next XID event, or None after ``timeout_ms`` without one.

        Raises ``NVMLUnavailable`` when the session is gone (re-subscribe later).
        """
        data = self._nvml.query(
            None,
            self._nvml.library.nvmlEventSetWait_v2,
            self._event_set,
            timeout_ms,
            session=self._session,
            absent=frozenset({ERROR_TIMEOUT}),
        )
        if data is None:
            return None
        gpu = self._gpus.get(_handle_key(data.device))
        if gpu is None or int(data.eventType) != EVENT_XID_CRITICAL_ERROR:
            return None
        return XidEvent(gpu, int(data.eventData))

    def close(self) -> None:
        library = self._nvml.library
        try:
            library.nvmlEventSetFree(self._event_set)
        except library.NVMLError as error:
            log.debug("nvmlEventSetFree: %s", error_name(error_code(error)))


class XidListener:
    """Counts XID critical errors per (GPU, XID code) from its own thread."""

    def __init__(
        self,
        nvml: NVML,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        retry_seconds: float = 10.0,
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._wall_clock = wall_clock
        #: The wall clock's steps (under ``_lock``); ``_counts`` holds steady times.
        self._wall_steps = WallSteps(clock(), wall_clock())
        self._retry_seconds = retry_seconds
        self._counts: dict[tuple[int, int], XidCount] = {}
        self._lock = threading.Lock()
        self._thread = BackgroundThread("gpu-xid", self._run)
        self.state = "starting"  # listening | unsupported | waiting for NVML

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def counts(self) -> Mapping[tuple[int, int], XidCount]:
        """Events so far by (GPU index, XID code), each with the Unix time of its latest
        as the wall clock reckons it now."""
        with self._lock:
            self._wall_steps.observe(self._clock(), self._wall_clock())
            unix = self._wall_steps.unix
            return {key: XidCount(count.count, unix(count.last_timestamp_seconds))
                    for key, count in self._counts.items()}

    def _record(self, gpu: int, xid: int) -> None:
        log.warning("XID %d on GPU %d", xid, gpu)
        with self._lock:
            previous = self._counts.get((gpu, xid))
            count = 1 if previous is None else previous.count + 1
            steady = self._wall_steps.observe(self._clock(), self._wall_clock())
            self._counts[(gpu, xid)] = XidCount(count, steady)

    def _run(self) -> None:
        stopping = self._thread.stopping
        while not stopping.is_set():
            try:
                subscription = XidSubscription.open(self._nvml)
            except NVMLUnavailable:
                self.state = "waiting for NVML"
                stopping.wait(self._retry_seconds)
                continue
            if subscription is None or not subscription.usable:
                self.state = "unsupported"
                if subscription is not None:
                    subscription.close()
                stopping.wait(max(60.0, self._retry_seconds))
                continue
            self.state = "listening"
            try:
                self._listen(subscription)
            finally:
                subscription.close()

    def _listen(self, subscription: XidSubscription) -> None:
        stopping = self._thread.stopping
        generation = self._nvml.generation
        while not stopping.is_set() and self._nvml.generation == generation:
            started = time.monotonic()
            try:
                event = subscription.wait(XID_WAIT_MS)
            except NVMLUnavailable:
                return
            if event is not None:
                self._record(event.gpu, event.xid)
                continue
            if not subscription.usable:
                return
            # An error that returns at once must not turn this loop into a spin.
            remaining = XID_WAIT_MS / 1000 - (time.monotonic() - started)
            if remaining > 0.05:
                stopping.wait(remaining)


def _handle_key(handle: Any) -> object:
    """A hashable identity of a device handle: ctypes pointers compare by address.

    ``ctypes`` is imported here, where NVML (which loaded it) already runs, not with the
    module: a node without a GPU never needs it."""
    import ctypes

    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle
