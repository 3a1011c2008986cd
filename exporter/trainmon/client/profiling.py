"""On-demand profiles inside the training process (``trainmon profile``).

Standard library only until a profile is asked; ``torch.profiler`` is imported then,
on the training thread.

The daemon publishes its open requests in a file beside its step socket
(``trainmon.profiling.requests``). ``ProfileAgent.poll`` runs on the reporter's
sender thread about once a second: one ``stat`` of that file, and a read only when
it changed (and is the daemon's: owned by the socket's owner). A request for this
rank of this job, not seen before, *arms* the reporter: its ``step`` attribute is
set, on the instance, to a ``_ProfiledSteps``, so the next ``reporter.step()`` goes
through it and nothing is added to ``step()`` while no profile is asked (a caller
that kept ``reporter.step`` as a bound method before is not profiled). That next
step ends where the profile starts (a step boundary); ``torch.profiler`` then runs
for the request's ``steps`` steps and stops at the boundary after the last, and
``reporter.step`` is the class's again.

What the profile found is sent from a thread of its own ("trainmon-profile"): the
Chrome/Perfetto trace (``export_chrome_trace``) gzip-compressed into an unnamed
temporary file, and one ``"type": "profile"`` line (docs/protocol.md, "Profiles":
the operators with the most self time on the CPU and on the device, their shares)
with the file's descriptor beside it (``SCM_RIGHTS``): the daemon reads the trace
from the descriptor, never from a path. Nothing here raises into training: a
profile that fails (no torch, a profiler already running, an export that fails)
logs one warning (rate-limited) and sends the line with ``error`` instead, which
the daemon counts.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainmon.logthrottle import LogThrottle
from trainmon.training.protocol import (
    MAX_OPERATOR_NAME_LENGTH,
    MAX_PROFILE_ERROR_LENGTH,
    MAX_PROFILE_OPERATORS,
    MAX_PROFILE_STEPS,
    PROFILE_ID_PATTERN,
)

log = logging.getLogger(__name__)

#: Largest request file read (bytes); a larger one is not the daemon's.
MAX_REQUEST_FILE_BYTES = 64 * 1024
#: Request ids remembered as answered (the latest).
MAX_ANSWERED = 64
#: Control characters are left out of operator names.
_CONTROL = dict.fromkeys(range(0x20)) | {0x7F: None}

#: Sends one payload with a file descriptor beside it (None: without); True if delivered.
SendAttached = Callable[[bytes, "int | None"], bool]


@dataclass(frozen=True)
class ProfileAsk:
    """A request for this rank: its id and how many steps to profile."""

    id: str
    steps: int


class RequestWatch:
    """The daemon's request file, as the sender thread sees it."""

    def __init__(self, path: str | None, socket_path: str | None) -> None:
        self.path = path
        self._socket_path = socket_path
        self._seen: tuple[int, int, int] | None = None
        self._answered: list[str] = []

    def poll(self, job: str, rank: int) -> ProfileAsk | None:
        """A request for ``rank`` of ``job`` not seen before; None (one ``stat``) when
        the file did not change."""
        if self.path is None:
            return None
        try:
            found = os.stat(self.path)
        except OSError:
            self._seen = None
            return None
        key = (found.st_ino, found.st_mtime_ns, found.st_size)
        if key == self._seen:
            return None
        self._seen = key
        if found.st_size > MAX_REQUEST_FILE_BYTES or not self._daemons(found.st_uid):
            return None
        try:
            with open(self.path, "rb") as file:
                document = json.loads(file.read(MAX_REQUEST_FILE_BYTES))
        except (OSError, ValueError, RecursionError):
            return None
        requests = document.get("requests") if isinstance(document, dict) else None
        for request in requests if isinstance(requests, list) else ():
            ask = _ask_for(request, job, rank)
            if ask is not None and ask.id not in self._answered:
                self._answered.append(ask.id)
                del self._answered[:-MAX_ANSWERED]
                return ask
        return None

    def _daemons(self, uid: int) -> bool:
        """Whether the file belongs to the user the step socket belongs to."""
        if self._socket_path is None:
            return False
        try:
            return os.stat(self._socket_path).st_uid == uid
        except OSError:
            return False


def _ask_for(request: object, job: str, rank: int) -> ProfileAsk | None:
    if not isinstance(request, dict) or request.get("job") != job:
        return None
    ranks, steps, request_id = request.get("ranks"), request.get("steps"), request.get("id")
    if not isinstance(ranks, list) or rank not in ranks:
        return None
    if type(steps) is not int or not 1 <= steps <= MAX_PROFILE_STEPS:
        return None
    if not isinstance(request_id, str) or not PROFILE_ID_PATTERN.fullmatch(request_id):
        return None
    return ProfileAsk(request_id, steps)


class ProfileAgent:
    """Arms a reporter for the profiles asked of it, runs them, and sends the results.

    ``line`` builds the ``"type": "profile"`` line from its fields (the reporter adds
    its identity); ``send`` delivers it with the trace's descriptor.
    """

    def __init__(self, reporter: Any, watch: RequestWatch,
                 line: Callable[[dict[str, object]], bytes], send: SendAttached) -> None:
        self._reporter = reporter
        self.watch = watch
        self._line = line
        self._send = send
        self._active: _ProfiledSteps | None = None
        self._uploads: list[threading.Thread] = []
        self._warnings = LogThrottle()
        #: Profiles that failed in this process, and those sent with their trace.
        self.failed = 0
        self.sent = 0

    def poll(self, job: str, rank: int) -> None:
        """The sender thread's look at the request file (once per report)."""
        if self._active is not None:
            return
        try:
            ask = self.watch.poll(job, rank)
        except Exception as error:  # a bug here must not end the sender thread
            if self._warnings.allow("poll"):
                log.warning("trainmon: cannot read the profile requests: %s", error)
            return
        if ask is not None:
            self._active = _ProfiledSteps(self, ask)
            self._reporter.step = self._active  # the next step() starts the profile

    def finished(self) -> None:
        """The profiled steps are done (or failed): ``step()`` is the class's again."""
        self._reporter.__dict__.pop("step", None)
        self._active = None

    def upload(self, ask: ProfileAsk, profiler: Any, seconds: float) -> None:
        """Export and send a stopped profile, on a thread of its own."""
        thread = threading.Thread(target=self._upload, args=(ask, profiler, seconds),
                                  name="trainmon-profile", daemon=True)
        self._uploads = [alive for alive in self._uploads if alive.is_alive()]
        self._uploads.append(thread)
        thread.start()

    def fail(self, ask: ProfileAsk, steps: int, seconds: float, error: BaseException | str
             ) -> None:
        """Send the profile's failure (one warning here, a counter at the daemon)."""
        self.failed += 1
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        if self._warnings.allow("profile"):
            log.warning("trainmon: profile %s failed: %s; training continues", ask.id, text)
        fields = {"id": ask.id, "steps": steps, "seconds": seconds,
                  "error": _clean(text, MAX_PROFILE_ERROR_LENGTH) or "failed"}
        self._send(self._line(fields), None)

    def abandon(self, give_up: float) -> None:
        """The reporter closes: a profile under way ends as failed, and the uploads in
        flight get until ``give_up`` (monotonic) to be sent."""
        active = self._active
        if active is not None:
            active.abandon()
        for thread in self._uploads:
            thread.join(timeout=max(0.0, give_up - time.monotonic()))

    def _upload(self, ask: ProfileAsk, profiler: Any, seconds: float) -> None:
        try:
            summary = summarize(profiler.key_averages())
            with tempfile.TemporaryFile(prefix="trainmon-trace-") as compressed:
                export_trace(profiler, compressed)
                delivered = self._send(self._line({"id": ask.id, "steps": ask.steps,
                                                   "seconds": seconds, **summary}),
                                       compressed.fileno())
            if delivered:
                self.sent += 1
            elif self._warnings.allow("send"):
                log.warning("trainmon: could not send profile %s to the daemon", ask.id)
        except Exception as error:  # whatever torch raises: never into training
            self.fail(ask, ask.steps, seconds, error)


class _ProfiledSteps:
    """``reporter.step`` while a profile is asked: the real step, then the profiler."""

    def __init__(self, agent: ProfileAgent, ask: ProfileAsk) -> None:
        self._agent = agent
        self._ask = ask
        self._profiler: Any = None
        self._steps = 0
        self._started = 0.0

    def __call__(self, samples: int | None = None) -> None:
        agent = self._agent
        type(agent._reporter).step(agent._reporter, samples)  # the step ends first
        try:
            if self._profiler is None:
                from trainmon.client.torch_profile import start_profiler

                self._profiler = start_profiler()
                self._started = time.perf_counter()
                return
            self._steps += 1
            if self._steps >= self._ask.steps:
                profiler, self._profiler = self._profiler, None
                profiler.stop()
                agent.finished()
                agent.upload(self._ask, profiler, time.perf_counter() - self._started)
        except Exception as error:  # torch's: the profile fails, training goes on
            self._stop_quietly()
            agent.finished()
            agent.fail(self._ask, self._steps, self._elapsed(), error)

    def abandon(self) -> None:
        self._stop_quietly()
        self._agent.finished()
        self._agent.fail(self._ask, self._steps, self._elapsed(),
                         f"the run closed after {self._steps} of {self._ask.steps} steps")

    def _elapsed(self) -> float:
        return time.perf_counter() - self._started if self._started else 0.0

    def _stop_quietly(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            with contextlib.suppress(Exception):  # it failed already: that error is sent
                profiler.stop()


def export_trace(profiler: Any, compressed: Any) -> None:
    """Write the profile's Chrome trace, gzip-compressed, to the open file ``compressed``."""
    with tempfile.TemporaryDirectory(prefix="trainmon-trace-") as folder:
        plain = os.path.join(folder, "trace.json")
        profiler.export_chrome_trace(plain)
        with open(plain, "rb") as source, gzip.GzipFile(fileobj=compressed, mode="wb",
                                                        compresslevel=6) as target:
            shutil.copyfileobj(source, target, 1 << 20)
    compressed.flush()


def summarize(averages: Any) -> dict[str, object]:
    """The operators with the most self time (``key_averages()``: microseconds), on the
    CPU and on the device, and their totals, as the profile line carries them."""
    rows = [(str(event.key), float(event.self_cpu_time_total), _device_time(event),
             int(event.count)) for event in averages]
    cpu_total = sum(row[1] for row in rows)
    device_total = sum(row[2] for row in rows)
    return {
        "self_cpu_seconds": cpu_total / 1e6,
        "self_device_seconds": device_total / 1e6 if device_total else None,
        "top_cpu": _top(rows, 1, cpu_total),
        "top_device": _top(rows, 2, device_total),
    }


def _device_time(event: Any) -> float:
    """Self time on the device (``self_device_time_total``; older torch:
    ``self_cuda_time_total``), microseconds."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def _top(rows: list[tuple[str, float, float, int]], column: int, total: float
         ) -> list[dict[str, object]]:
    """The ``MAX_PROFILE_OPERATORS`` rows with the most time in ``column`` (1: CPU,
    2: device), each with its share of ``total``."""
    if total <= 0:
        return []
    timed = [(row[0], row[1] if column == 1 else row[2], row[3]) for row in rows]
    ranked = sorted((row for row in timed if row[1] > 0), key=lambda row: -row[1])
    return [{"name": _clean(name, MAX_OPERATOR_NAME_LENGTH) or "?",
             "self_seconds": micros / 1e6, "share": min(micros / total, 1.0),
             "calls": calls} for name, micros, calls in ranked[:MAX_PROFILE_OPERATORS]]


def _clean(text: str, limit: int) -> str:
    """``text`` without control characters, at most ``limit`` characters."""
    return text.translate(_CONTROL)[:limit]
