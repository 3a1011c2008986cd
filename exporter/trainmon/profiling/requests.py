"""Open profile requests, and the file through which the daemon asks its clients.

``trainmon profile JOB`` asks the daemon (``trainmon.profiling.service``); the
daemon cannot call a training process, which only ever sends datagrams. So it
*publishes* its open requests: one small JSON file beside the step socket
(``trainmon.paths.profile_requests_path``: ``/run/trainmon/profile-requests.json``,
in the folder a DaemonSet shares with its pods), rewritten whole (a temporary
file renamed over it) on every change and removed when no request is open::

    {"v": 1, "requests": [{"id": "9f1c…", "job": "resnet", "ranks": [0], "steps": 5,
                           "expires": 1764851234.5}]}

Each client's sender thread looks at it with one ``stat`` a second and reads it
only when it changed (``trainmon.client.profiling``); ``step()`` never does. The
folder belongs to root (or the daemon's user) and nobody else can write in it
(``trainmon.paths.check_folder``), so only the daemon can ask. Anyone may read the
file: it names jobs and ranks, as ``/metrics`` does.

Bounds (docs/security.md): at most ``max_open`` requests at once and one per job;
each expires ``timeout_seconds`` after it was made; the finished ones are kept for
their status (``trainmon profile`` polls it) at most ``MAX_FINISHED`` of the latest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.logthrottle import LogThrottle

log = logging.getLogger(__name__)

#: Finished requests whose status is kept (the latest).
MAX_FINISHED = 64
#: Version of the request file's format.
REQUESTS_FILE_VERSION = 1
#: Mode of the request file: every training user reads it.
REQUESTS_FILE_MODE = 0o644
#: The states of a rank that has not finished (then ``stored``, ``failed`` or
#: ``expired``: ``ProfileRequests.status``).
OPEN_STATES = frozenset({"pending", "receiving"})


class RequestRefused(Exception):
    """A profile request that cannot be opened: ``reason`` (a label value of
    ``trainmon_profile_requests_total``) and the HTTP status to answer."""

    def __init__(self, reason: str, status: int, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.status = status


@dataclass
class ProfileRequest:
    """One request: which ranks of which job profile how many steps, and what each did."""

    id: str
    job: str
    #: The job's owner (writer identity) when it was asked: only its uploads count.
    owner: str
    #: Who asked (``uid:0``, ``uid:1000``).
    requester: str
    ranks: tuple[int, ...]
    steps: int
    #: Unix time it was made, and the monotonic time it expires.
    created: float
    deadline: float
    expires: float
    #: rank -> its state (``pending``, ``receiving``, ``stored``, ``failed``, ``expired``)
    #: and what it left (``ProfileRequests.finish``).
    results: dict[int, dict[str, object]] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return any(result["state"] in OPEN_STATES for result in self.results.values())

    def public(self) -> dict[str, object]:
        """As the request file carries it."""
        return {"id": self.id, "job": self.job, "ranks": list(self.ranks), "steps": self.steps,
                "expires": self.expires}

    def status(self) -> dict[str, object]:
        """As ``GET /api/v1/profile`` answers it."""
        return {**self.public(), "owner": self.owner, "created": self.created,
                "open": self.open,
                "ranks_state": {str(rank): dict(result) for rank, result in
                                sorted(self.results.items())}}


class ProfileRequests:
    """The open and recently finished requests, and the request file of the open ones."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_open: int,
        timeout_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        #: None: no socket, no clients to ask (the requests can only expire).
        self.path = path
        self._max_open = max_open
        self._timeout = timeout_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self._new_id = new_id or _random_id
        self._lock = threading.Lock()
        self._open: OrderedDict[str, ProfileRequest] = OrderedDict()
        self._finished: OrderedDict[str, ProfileRequest] = OrderedDict()
        #: rank results by state, since start (``trainmon_profile_results_total``).
        self.expired = 0
        self._write_errors = LogThrottle()

    def open(self, job: str, owner: str, requester: str, ranks: tuple[int, ...],
             steps: int) -> ProfileRequest:
        """Open a request and publish it; ``RequestRefused`` past a bound."""
        with self._lock:
            self._expire()
            if any(request.job == job for request in self._open.values()):
                raise RequestRefused("conflict", 409,
                                     f"a profile of job {job!r} is already under way")
            if len(self._open) >= self._max_open:
                raise RequestRefused("limit", 429,
                                     f"{len(self._open)} profiles are under way "
                                     f"(collectors.profiling.max_open_requests)")
            now = self._clock()
            created = self._wall_clock()
            request = ProfileRequest(
                id=self._new_id(), job=job, owner=owner, requester=requester, ranks=ranks,
                steps=steps, created=created, deadline=now + self._timeout,
                expires=created + self._timeout,
                results={rank: {"state": "pending"} for rank in ranks})
            self._open[request.id] = request
            self._publish()
            return request

    def expecting(self, request_id: str, job: str, rank: int) -> ProfileRequest | None:
        """The open request ``request_id`` when it asks ``rank`` of ``job`` and that
        rank has not answered yet; None otherwise (an unsolicited upload)."""
        with self._lock:
            self._expire()
            request = self._open.get(request_id)
            if request is None or request.job != job:
                return None
            result = request.results.get(rank)
            return request if result is not None and result["state"] == "pending" else None

    def finish(self, request_id: str, rank: int, result: Mapping[str, object]) -> None:
        """Rank ``rank`` answered ``request_id`` (``result["state"]``: stored or failed);
        the request closes, and leaves the file, once every rank has."""
        with self._lock:
            request = self._open.get(request_id)
            if request is None or rank not in request.results:
                return
            request.results[rank] = dict(result)
            if not request.open:
                self._close(request)
                self._publish()

    def status(self, request_id: str) -> dict[str, object] | None:
        with self._lock:
            self._expire()
            request = self._open.get(request_id) or self._finished.get(request_id)
            return None if request is None else request.status()

    def now(self) -> float:
        """The Unix time, by the clock the requests are dated with."""
        return self._wall_clock()

    def open_count(self) -> int:
        with self._lock:
            self._expire()
            return len(self._open)

    def close(self) -> None:
        """The daemon stops: nothing is asked any longer."""
        with self._lock:
            self._open.clear()
            self._publish()

    # -- under the lock -----------------------------------------------------------

    def _expire(self) -> None:
        now = self._clock()
        due = [request for request in self._open.values() if request.deadline <= now]
        for request in due:
            for rank, result in request.results.items():
                if result["state"] in OPEN_STATES:
                    request.results[rank] = {"state": "expired"}
                    self.expired += 1
            self._close(request)
        if due:
            self._publish()

    def _close(self, request: ProfileRequest) -> None:
        self._open.pop(request.id, None)
        self._finished[request.id] = request
        while len(self._finished) > MAX_FINISHED:
            self._finished.popitem(last=False)

    def _publish(self) -> None:
        """Write the open requests to the request file (atomically), or remove it."""
        path = self.path
        if path is None:
            return
        try:
            if not self._open:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                return
            body = json.dumps({"v": REQUESTS_FILE_VERSION,
                               "requests": [request.public() for request
                                            in self._open.values()]},
                              separators=(",", ":")).encode() + b"\n"
            temporary = path.with_name(f".{path.name}.{os.getpid()}")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                                 | os.O_NOFOLLOW | os.O_CLOEXEC, REQUESTS_FILE_MODE)
            try:
                os.fchmod(descriptor, REQUESTS_FILE_MODE)  # whatever the umask says
                os.write(descriptor, body)
            finally:
                os.close(descriptor)
            os.replace(temporary, path)
        except OSError as error:
            if self._write_errors.allow("write"):
                log.error("cannot write the profile requests to %s: %s; the training "
                          "processes will not see them (rate-limited)", path, error)


def _random_id() -> str:
    """128 random bits as hex: the request's id."""
    return os.urandom(16).hex()
