"""On-demand profiles: who may ask, what the daemon asks, and what comes back.

``POST /api/v1/profile`` (``trainmon profile JOB [--rank N | --all] [--steps K]``)
opens a request: the body ``{"job": "resnet", "ranks": [0] | "all" | null,
"steps": 5}`` (``ranks`` null: the job's lowest rank reporting here). Only the job's
owner may ask, or root, the daemon's own user and the trusted writers: the writer
identity of the push path (``StepPushHandler.writer``: the loopback client's local
user as the kernel names it, or a bearer token's name). Anyone else is answered
403 and counted (``trainmon_profile_requests_total{result="forbidden"}``); so is
every other refusal (``not_found``, ``invalid``, ``conflict``, ``limit``). The answer
carries the request's ``id``; ``GET /api/v1/profile?id=…`` answers its status (the
id is 128 random bits).

The request reaches the job's ranks through the request file
(``trainmon.profiling.requests``). A rank answers with one ``"type": "profile"``
line on the step socket (``trainmon.training.protocol.ProfileReport``: its top
operators, or why it failed) and its trace as a file descriptor beside it
(``take``). The line counts only from the job's owner (or a trusted writer), for a
rank the open request asked and that has not answered yet: anything else is refused
(``forbidden``, ``unsolicited``) before a byte of the trace is read. The trace is
kept by ``trainmon.profiling.traces``; the summary goes to the run's ledger record
(``note``: ``RunRecorder.note_profile``) and to the request's status.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus

from trainmon.core.routes import GetRequest, JSONResponse, PushRequest, PushResponse
from trainmon.logthrottle import LogThrottle
from trainmon.profiling.requests import ProfileRequests, RequestRefused
from trainmon.profiling.traces import TRACE_PROBLEMS, StoredTrace, TraceKeeper, TraceProblem
from trainmon.training.protocol import (
    MAX_PROFILE_STEPS,
    PROFILE_ID_PATTERN,
    ProfiledOperator,
    ProfileReport,
    ReportError,
)

log = logging.getLogger(__name__)

#: The routes.
PROFILE_PATH = "/api/v1/profile"
#: Outcomes of ``POST /api/v1/profile`` (``trainmon_profile_requests_total{result}``).
REQUEST_RESULTS: tuple[str, ...] = (
    "accepted", "forbidden", "not_found", "invalid", "conflict", "limit")
#: Outcomes of one rank of a request (``trainmon_profile_results_total{result}``):
#: kept, failed in the training process, never answered, or an upload refused.
RESULTS: tuple[str, ...] = (
    "stored", "failed", "expired", "forbidden", "unsolicited", *TRACE_PROBLEMS)

#: Writes a profile into its run's ledger record: (job, run, owner, entry).
Note = Callable[[str, str, str, Mapping[str, object]], None]
#: Who a push-route request writes as, or the refusal (``StepPushHandler.writer``).
Writer = Callable[[PushRequest], "tuple[str | None, PushResponse | None]"]


#: The job's owner and its ranks reporting here now; None when it does not report
#: (``TrainingStore.job_ranks``).
JobLookup = Callable[[str], "tuple[str, tuple[int, ...]] | None"]


class ProfileService:
    """The routes, the profile sink of the step socket, and their counters."""

    def __init__(
        self,
        requests: ProfileRequests,
        traces: TraceKeeper,
        *,
        job_of: JobLookup,
        writer: Writer,
        trusted: Callable[[], frozenset[str]],
        note: Note | None,
        default_steps: int,
        max_steps: int,
    ) -> None:
        self.requests = requests
        self.traces = traces
        self._job_of = job_of
        self._writer = writer
        #: Who may ask for and answer any job's profile: the writers the training store
        #: trusts (root, the daemon's own user, ``trusted_writers``), as it trusts them
        #: now (a reload may change them).
        self._trusted = trusted
        self._note = note
        self._default_steps = default_steps
        self._max_steps = min(max_steps, MAX_PROFILE_STEPS)
        self._lock = threading.Lock()
        self._requested = dict.fromkeys(REQUEST_RESULTS, 0)
        self._results = dict.fromkeys(RESULTS, 0)
        self._refusals = LogThrottle()

    # -- the routes ---------------------------------------------------------------

    def handle_request(self, request: PushRequest) -> PushResponse:
        """``POST /api/v1/profile``."""
        identity, denied = self._writer(request)
        if denied is not None:
            self._count_request("forbidden")
            return denied
        assert identity is not None
        if request.too_large:
            return self._refuse("invalid", HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
        try:
            asked = json.loads(request.body or b"{}")
        except (ValueError, RecursionError):
            return self._refuse("invalid", HTTPStatus.BAD_REQUEST, "the body must be JSON")
        if not isinstance(asked, dict) or not isinstance(asked.get("job"), str):
            return self._refuse("invalid", HTTPStatus.BAD_REQUEST,
                                'expected {"job": "...", "ranks": [0] | "all", "steps": 5}')
        job: str = asked["job"]
        steps = asked.get("steps", self._default_steps)
        if type(steps) is not int or not 1 <= steps <= self._max_steps:
            return self._refuse("invalid", HTTPStatus.BAD_REQUEST,
                                f"steps must be 1..{self._max_steps}")
        owner, reporting = self._job_of(job) or ("", ())
        if not reporting:
            return self._refuse("not_found", HTTPStatus.NOT_FOUND,
                                f"no rank of job {job[:200]!r} reports to this daemon")
        if identity != owner and identity not in self._trusted():
            if self._refusals.allow("forbidden", identity):
                log.warning("refused a profile of job %r to %s: it belongs to %s "
                            "(rate-limited)", job[:200], identity, owner)
            return self._refuse("forbidden", HTTPStatus.FORBIDDEN,
                                f"job {job[:200]!r} belongs to another user; only its owner "
                                "and root may profile it")
        ranks = _chosen_ranks(asked.get("ranks"), reporting)
        if isinstance(ranks, str):
            return self._refuse("invalid", HTTPStatus.BAD_REQUEST, ranks)
        try:
            opened = self.requests.open(job, owner, identity, ranks, steps)
        except RequestRefused as refused:
            return self._refuse(refused.reason, refused.status, str(refused))
        self._count_request("accepted")
        log.info("profile %s: %d step(s) of rank(s) %s of job %r, asked by %s", opened.id,
                 steps, ",".join(map(str, ranks)), job, identity)
        return PushResponse(HTTPStatus.ACCEPTED, opened.status())

    def handle_status(self, request: GetRequest) -> JSONResponse:
        """``GET /api/v1/profile?id=…``."""
        request_id = request.query.get("id", "")
        if not PROFILE_ID_PATTERN.fullmatch(request_id):
            return JSONResponse(HTTPStatus.BAD_REQUEST, {"error": "id must be hex digits"})
        status = self.requests.status(request_id)
        if status is None:
            return JSONResponse(HTTPStatus.NOT_FOUND, {"error": "no such profile request"})
        return JSONResponse(HTTPStatus.OK, status)

    # -- the step socket's profile lines -----------------------------------------

    def take(self, report: ProfileReport, descriptor: int | None, identity: str) -> None:
        """A rank's answer (``trainmon.training.receiver.ProfileSink``); the descriptor
        is closed here or by the trace keeper. Raises ``ReportError`` to refuse it."""
        try:
            owner = self._answerable(report, identity)
        except ReportError:
            if descriptor is not None:
                os.close(descriptor)
            raise
        if report.error is not None or descriptor is None:
            if descriptor is not None:
                os.close(descriptor)
            self._finish(report, owner, None, report.error or "no trace came with the profile")
            return
        self.requests.finish(report.id, report.rank, {"state": "receiving"})
        try:
            self.traces.submit(report, owner, descriptor, self._stored)
        except TraceProblem as problem:
            self._finish(report, owner, None, str(problem), problem.reason)

    def _answerable(self, report: ProfileReport, identity: str) -> str:
        """The owner whose request ``report`` answers; ``ReportError`` otherwise."""
        request = self.requests.expecting(report.id, report.job, report.rank)
        if request is None:
            self._count_result("unsolicited")
            raise ReportError("invalid_field", "no open profile request asks this rank")
        if identity != request.owner and identity not in self._trusted():
            self._count_result("forbidden")
            raise ReportError("forbidden", f"job {report.job!r} belongs to another writer")
        return request.owner

    def _stored(self, report: ProfileReport, owner: str,
                outcome: StoredTrace | TraceProblem) -> None:
        """The trace keeper's word on an upload (its worker thread)."""
        if isinstance(outcome, TraceProblem):
            self._finish(report, owner, None, str(outcome), outcome.reason)
        else:
            self._finish(report, owner, outcome, None)

    def _finish(self, report: ProfileReport, owner: str, trace: StoredTrace | None,
                error: str | None, reason: str = "failed") -> None:
        entry = ledger_entry(report, trace, error, self.requests.now())
        self._count_result("stored" if trace is not None else reason)
        if error is not None and self._refusals.allow("failed", report.job):
            log.warning("profile %s of rank %d of job %r: %s (rate-limited)", report.id,
                        report.rank, report.job, error)
        if self._note is not None and report.run is not None:
            self._note(report.job, report.run, owner, entry)
        # last: whoever follows the request sees it finished with the rest done
        self.requests.finish(report.id, report.rank, {
            "state": "stored" if trace is not None else "failed", **entry})

    # -- counters -----------------------------------------------------------------

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Requests by result, and rank results by result, since start."""
        with self._lock:
            return dict(self._requested), {**self._results, "expired": self.requests.expired}

    def _refuse(self, reason: str, status: int, detail: str) -> PushResponse:
        self._count_request(reason)
        return PushResponse(status, {"error": reason, "detail": detail})

    def _count_request(self, result: str) -> None:
        with self._lock:
            self._requested[result] += 1

    def _count_result(self, result: str) -> None:
        with self._lock:
            self._results[result] += 1


def _chosen_ranks(asked: object, reporting: tuple[int, ...]) -> tuple[int, ...] | str:
    """The ranks a request names among those ``reporting``; a text saying what is wrong."""
    if asked is None:
        return (min(reporting),)
    if asked == "all":
        return tuple(sorted(reporting))
    if not isinstance(asked, list) or not asked or not all(
            type(rank) is int for rank in asked):
        return 'ranks must be a list of rank numbers, "all" or null'
    missing = sorted(set(asked) - set(reporting))
    if missing:
        return (f"rank(s) {', '.join(map(str, missing[:8]))} do not report to this daemon "
                f"(reporting: {', '.join(map(str, sorted(reporting)[:16]))})")
    return tuple(sorted(set(asked)))


def ledger_entry(report: ProfileReport, trace: StoredTrace | None, error: str | None,
                 received: float) -> dict[str, object]:
    """A profile as the ledger keeps it (``trainmon.ledger.summary``, "profiles")."""
    return {
        "id": report.id, "rank": report.rank, "time": received, "steps": report.steps,
        "seconds": report.seconds, "trace": None if trace is None else str(trace.path),
        "trace_bytes": None if trace is None else trace.size, "error": error,
        "self_cpu_seconds": report.self_cpu_seconds,
        "self_device_seconds": report.self_device_seconds,
        "top_cpu": [_operator(operator) for operator in report.top_cpu],
        "top_device": [_operator(operator) for operator in report.top_device],
    }


def _operator(operator: ProfiledOperator) -> dict[str, object]:
    return {"name": operator.name, "self_seconds": operator.self_seconds,
            "share": operator.share, "calls": operator.calls}
