"""The ledger's read routes: ``GET /api/v1/runs`` and ``GET /api/v1/runs/<run>`` as JSON.

``GET /api/v1/runs?job=&since=&limit=&cursor=`` and
``GET /api/v1/runs/<run>?job=&limit=&cursor=`` serve the records
(``RunRecord.to_json``) as a JSON list, one page at a time, newest first in the
order of ``trainmon.ledger.store.RunKey``. A page holds ``limit`` records
(``DEFAULT_LIMIT`` without one, at most ``MAX_LIMIT``) and at most
``max_body_bytes`` of JSON: the records past either go to the next page
(a page holds at least one record). When there are more, the answer has a
``Link: </api/v1/runs?...&cursor=C>; rel="next"`` header (RFC 8288); the
cursor is opaque (the last record's key, base64url JSON) and the pages go on
where the previous one ended whatever was inserted since (keyset pagination:
every record present throughout is on exactly one page). The list stays a
list, so a client that reads one answer gets the newest page.

Bounded by design: each request reads from a read-only connection of its own
(SQLite only: ``trainmon.ledger.schema`` says why no other descriptor of the
file may be opened in this process) one row at a time and encodes it at once,
so it never holds more than one page; at most ``max_concurrent`` requests are
served at once and the others answered ``503`` with ``Retry-After: 1`` at once,
so parallel requests cannot multiply the memory. Refusals (``busy``,
``invalid_query``) and pages cut short (``max_body_bytes``, ``max_limit``) are
counted (``counts``: the ledger collector exports them) and logged,
rate-limited. The ledger collector declares the routes
(``Collector.get_routes``); the HTTP server serves them behind its basic auth.
``trainmon runs`` reads them when the ledger file is not readable
(``trainmon.runs.daemon``, which follows the cursor).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Literal

from trainmon.core.routes import GetHandler, GetRequest, JSONResponse
from trainmon.ledger.records import RunRecord
from trainmon.ledger.schema import LedgerError
from trainmon.ledger.store import Ledger, RunKey
from trainmon.logthrottle import LogThrottle

RUNS_PATH = "/api/v1/runs"
#: Records per page when the request gives no ``limit``.
DEFAULT_LIMIT = 100
#: The most records one page holds (a larger ``limit`` is read as this).
MAX_LIMIT = 1000
#: The most bytes of JSON one page holds, records past it go to the next page.
MAX_BODY_BYTES = 2 * 1024 * 1024
#: Requests answered at once; the others get 503.
MAX_CONCURRENT_REQUESTS = 2
#: ``Retry-After`` of a 503 for a busy route (seconds).
RETRY_AFTER_SECONDS = 1
#: The longest cursor read (a cursor is the key of one record).
MAX_CURSOR_LENGTH = 4096
#: Repeats of one refusal's log line at most this often (seconds).
LOG_INTERVAL_SECONDS = 60.0

RefusalReason = Literal["busy", "invalid_query"]
REFUSAL_REASONS: tuple[RefusalReason, ...] = ("busy", "invalid_query")
CutReason = Literal["max_body_bytes", "max_limit"]
CUT_REASONS: tuple[CutReason, ...] = ("max_body_bytes", "max_limit")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunsAPICounts:
    """What the routes refused and cut since the daemon started."""

    #: Requests refused, by reason: ``busy`` (``max_concurrent`` requests being
    #: answered), ``invalid_query`` (a bad ``since``, ``limit`` or ``cursor``).
    refused: Mapping[RefusalReason, int]
    #: Pages that held fewer records than asked for, by the limit that cut them.
    cut: Mapping[CutReason, int]


@dataclass(frozen=True)
class Page:
    """One page: its JSON text and the key the next page starts after."""

    body: bytes
    records: int
    #: The last record's key when more records follow; None on the last page.
    next_after: RunKey | None
    #: Why the page ended before ``limit`` records while more followed.
    cut: CutReason | None = None


class RunsAPI:
    """The JSON read routes over the ledger file at ``path``."""

    def __init__(self, path: Path, *, max_body_bytes: int = MAX_BODY_BYTES,
                 max_concurrent: int = MAX_CONCURRENT_REQUESTS) -> None:
        self._path = path
        self.max_body_bytes = max_body_bytes
        self.max_concurrent = max_concurrent
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._lock = threading.Lock()
        self._refused: dict[RefusalReason, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        self._cut: dict[CutReason, int] = dict.fromkeys(CUT_REASONS, 0)
        self._logged = LogThrottle(LOG_INTERVAL_SECONDS)

    def routes(self) -> Mapping[str, GetHandler]:
        return {RUNS_PATH: self.handle_runs, RUNS_PATH + "/": self.handle_run}

    def counts(self) -> RunsAPICounts:
        with self._lock:
            return RunsAPICounts(dict(self._refused), dict(self._cut))

    def handle_runs(self, request: GetRequest) -> JSONResponse:
        """``GET /api/v1/runs?job=&since=&limit=&cursor=``: one page, newest first."""
        job = request.query.get("job") or None
        since_text = request.query.get("since")
        since = None
        if since_text:
            try:
                since = float(since_text)
            except ValueError:
                since = math.nan
            if not math.isfinite(since):
                return self._invalid("since must be a Unix time in seconds")
        return self._page(request, RUNS_PATH, job=job, since=since, run=None)

    def handle_run(self, request: GetRequest) -> JSONResponse:
        """``GET /api/v1/runs/<run>?job=&limit=&cursor=``: the records of one run (404
        when none), paged as the list."""
        run = request.path[len(RUNS_PATH) + 1:]
        if not run or "/" in run:
            return JSONResponse(HTTPStatus.NOT_FOUND, {"error": "not_found", "detail": "no run"})
        job = request.query.get("job") or None
        path = f"{RUNS_PATH}/{urllib.parse.quote(run, safe='')}"
        response = self._page(request, path, job=job, since=None, run=run)
        if (response.status == HTTPStatus.OK and response.body == b"[]\n"
                and "cursor" not in request.query):
            return JSONResponse(HTTPStatus.NOT_FOUND, {
                "error": "not_found", "detail": f"no run {run!r} in this node's ledger"})
        return response

    def _page(self, request: GetRequest, path: str, *, job: str | None, since: float | None,
              run: str | None) -> JSONResponse:
        try:
            limit, asked = _limit(request.query.get("limit"))
            after = decode_cursor(request.query["cursor"]) if "cursor" in request.query else None
        except ValueError as error:
            return self._invalid(str(error))
        if not self._slots.acquire(blocking=False):
            self._refuse("busy", f"{self.max_concurrent} requests being answered")
            return JSONResponse(
                HTTPStatus.SERVICE_UNAVAILABLE,
                {"error": "busy", "detail": f"at most {self.max_concurrent} requests for runs "
                 "are answered at once; retry"},
                {"Retry-After": str(RETRY_AFTER_SECONDS)})
        try:
            with Ledger.open(self._path, readonly=True) as ledger:
                page = encode_page(ledger.each_run(job=job, since=since, run=run, after=after),
                                   limit, self.max_body_bytes)
        except LedgerError as error:
            return JSONResponse(HTTPStatus.SERVICE_UNAVAILABLE,
                                {"error": "ledger_unavailable", "detail": str(error)})
        finally:
            self._slots.release()
        cut = page.cut if page.cut is not None else (
            "max_limit" if asked > MAX_LIMIT and page.next_after is not None else None)
        if cut is not None:
            with self._lock:
                self._cut[cut] += 1
        headers = {}
        if page.next_after is not None:
            query = {key: value for key, value in request.query.items()
                     if key in ("job", "since")}
            query.update(limit=str(limit), cursor=encode_cursor(page.next_after))
            headers["Link"] = f'<{path}?{urllib.parse.urlencode(query)}>; rel="next"'
        return JSONResponse(HTTPStatus.OK, page.body, headers)

    def _invalid(self, detail: str) -> JSONResponse:
        self._refuse("invalid_query", detail)
        return JSONResponse(HTTPStatus.BAD_REQUEST, {"error": "invalid_query", "detail": detail})

    def _refuse(self, reason: RefusalReason, detail: str) -> None:
        with self._lock:
            self._refused[reason] += 1
        held_back = self._logged.admit(reason)
        if held_back is not None:
            log.warning("GET %s refused (%s: %s); %s", RUNS_PATH, reason, detail,
                        f"{held_back} more since the last such line" if held_back else
                        "more are counted in trainmon_ledger_api_refused_requests_total")


def encode_page(records: Iterator[RunRecord], limit: int, max_bytes: int) -> Page:
    """The JSON list of the first ``limit`` records of ``records`` that fit in
    ``max_bytes`` (at least one), reading one record past them to know if more follow."""
    parts: list[bytes] = []
    size = len(b"[]\n")
    last: RunKey | None = None
    for record in records:
        if len(parts) == limit:
            return _page(parts, last, None)
        encoded = json.dumps(record.to_json(), sort_keys=True).encode()
        if parts and size + len(encoded) + 1 > max_bytes:
            return _page(parts, last, "max_body_bytes")
        parts.append(encoded)
        size += len(encoded) + 1
        last = (record.started, record.run, record.job, record.node)
    return _page(parts, None, None)


def _page(parts: list[bytes], next_after: RunKey | None, cut: CutReason | None) -> Page:
    return Page(b"[" + b",".join(parts) + b"]\n", len(parts), next_after, cut)


def encode_cursor(key: RunKey) -> str:
    """The opaque cursor of the page after the record with ``key``."""
    text = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(text).decode().rstrip("=")


def decode_cursor(cursor: str) -> RunKey:
    """The key a cursor stands for; ``ValueError`` when it is not one of ours."""
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise ValueError("cursor is not a cursor of this route")
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error):
        raise ValueError("cursor is not a cursor of this route") from None
    if (not isinstance(value, list) or len(value) != 4
            or not isinstance(value[0], (int, float)) or isinstance(value[0], bool)
            or not math.isfinite(value[0]) or not all(isinstance(v, str) for v in value[1:])):
        raise ValueError("cursor is not a cursor of this route")
    return float(value[0]), value[1], value[2], value[3]


def _limit(text: str | None) -> tuple[int, int]:
    """The page size to serve and the one asked for (``DEFAULT_LIMIT`` without one)."""
    if text is None or text == "":
        return DEFAULT_LIMIT, DEFAULT_LIMIT
    try:
        asked = int(text)
    except ValueError:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}") from None
    if asked < 1:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return min(asked, MAX_LIMIT), asked
