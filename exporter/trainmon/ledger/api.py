"""The ledger's read routes: ``GET /api/v1/runs`` and ``GET /api/v1/runs/<run>`` as JSON.

``GET /api/v1/runs?job=&since=`` and ``GET /api/v1/runs/<run>?job=`` serve the
records as JSON lists (``RunRecord.to_json``) from a read-only connection per
request (SQLite only: ``trainmon.ledger.schema`` says why no other descriptor
of the file may be opened in this process). The ledger collector declares
them (``Collector.get_routes``); the HTTP server serves them behind its basic
auth. ``trainmon runs`` reads them when the ledger file is not readable
(``trainmon.runs.daemon``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from http import HTTPStatus
from pathlib import Path

from trainmon.core.routes import GetHandler, GetRequest, JSONResponse
from trainmon.ledger.records import RunRecord
from trainmon.ledger.schema import LedgerError
from trainmon.ledger.store import Ledger

RUNS_PATH = "/api/v1/runs"


class RunsAPI:
    """The JSON read routes over the ledger file at ``path``."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def routes(self) -> Mapping[str, GetHandler]:
        return {RUNS_PATH: self.handle_runs, RUNS_PATH + "/": self.handle_run}

    def handle_runs(self, request: GetRequest) -> JSONResponse:
        """``GET /api/v1/runs?job=&since=``: every record, newest first."""
        job = request.query.get("job") or None
        since_text = request.query.get("since")
        since = None
        if since_text:
            try:
                since = float(since_text)
            except ValueError:
                since = math.nan
            if not math.isfinite(since):
                return JSONResponse(HTTPStatus.BAD_REQUEST, {
                    "error": "invalid_query", "detail": "since must be a Unix time in seconds"})
        return self._read(lambda ledger: ledger.runs(job=job, since=since))

    def handle_run(self, request: GetRequest) -> JSONResponse:
        """``GET /api/v1/runs/<run>?job=``: the records of one run (404 when none)."""
        run = request.path[len(RUNS_PATH) + 1:]
        if not run or "/" in run:
            return JSONResponse(HTTPStatus.NOT_FOUND, {"error": "not_found", "detail": "no run"})
        job = request.query.get("job") or None
        response = self._read(lambda ledger: ledger.get(run, job=job))
        if response.status == HTTPStatus.OK and not response.body:
            return JSONResponse(HTTPStatus.NOT_FOUND, {
                "error": "not_found", "detail": f"no run {run!r} in this node's ledger"})
        return response

    def _read(self, query: Callable[[Ledger], list[RunRecord]]) -> JSONResponse:
        try:
            with Ledger.open(self._path, readonly=True) as ledger:
                records = query(ledger)
        except LedgerError as error:
            return JSONResponse(HTTPStatus.SERVICE_UNAVAILABLE,
                                {"error": "ledger_unavailable", "detail": str(error)})
        return JSONResponse(HTTPStatus.OK, [record.to_json() for record in records])
