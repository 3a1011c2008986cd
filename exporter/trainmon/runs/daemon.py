"""The local daemon's ``GET /api/v1/runs`` as a source of runs, and the choice
between it and the ledger file when no flag names a source.

``trainmon runs`` and ``compare`` without ``--ledger`` or ``--prometheus``
read the ledger of the user running them (``collectors.ledger.path`` of
``--config``, else ``trainmon.paths``' default: root's
``/var/lib/trainmon/ledger.sqlite3``, another user's under
``$XDG_STATE_HOME``) when this process may read it; otherwise (no such file,
or a root daemon's ``0640`` file, group ``trainmon``) they ask the daemon
found by ``trainmon.local_daemon``, which reads its own ledger. Either way a
line on stderr names the source; in ``--json`` each run's ``source`` is
``ledger`` or ``daemon``.

``--url URL`` names a daemon to read instead (``open_daemon``). A daemon on
this node is read only when the kernel names a trusted owner for its
listening socket (``trainmon.local_daemon.TrustedDaemon``; else
``UntrustedDaemon``, exit 2), the stderr line says which pid and uid were
read, and after the last page the same socket must still listen.

The daemon answers with ``RunRecord.to_json`` lists (``trainmon.ledger.api``),
one record per node that saw the run: only this node's here, a page at a time;
``DaemonSource`` follows the ``Link: <...>; rel="next"`` cursor (only its
``cursor``, asked of the same URL: a link elsewhere is never followed) up to
``MAX_RECORDS``, and retries a page the daemon answered ``503 busy`` after its
``Retry-After``. A daemon that does not answer, asks for basic auth, or cannot
read its ledger is a ``DaemonError`` (exit 1) that names the file it could not
read either.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

import requests

from trainmon.ledger.api import MAX_LIMIT
from trainmon.ledger.records import RunRecord
from trainmon.local_daemon import DaemonTrust, TrustedDaemon
from trainmon.runs.local import LocalSource, one_run
from trainmon.runs.view import RunView

#: Seconds one request to the daemon may take.
TIMEOUT_SECONDS = 10.0
#: The most records one listing reads (the pages followed until then).
MAX_RECORDS = 100_000
#: Times a page answered ``503 busy`` is asked again, and the longest wait between.
BUSY_RETRIES = 5
MAX_RETRY_WAIT_SECONDS = 5.0


class DaemonError(Exception):
    """The daemon could not be asked, or refused (the CLI exits 1)."""


class DaemonSource:
    """``runs``/``run`` from a daemon's ``/api/v1/runs``; ``close()`` when done."""

    def __init__(self, url: str, *, session: requests.Session | None = None,
                 timeout: float = TIMEOUT_SECONDS, instead_of: Path | None = None,
                 daemon: TrustedDaemon | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = url.rstrip("/")
        self.http = session if session is not None else requests.Session()
        self.timeout = timeout
        #: The ledger file read in its place, named in errors.
        self.instead_of = instead_of
        #: The owner check of a daemon on this node, confirmed after each reading.
        self.daemon = daemon
        self._sleep = sleep

    def runs(self, job: str | None = None, since: float | None = None) -> list[RunView]:
        """Newest first (the daemon's order)."""
        params = {key: value for key, value in (("job", job), ("since", since))
                  if value is not None}
        return [RunView.from_records([record], source="daemon")
                for record in self._records("", params)]

    def run(self, run: str, job: str | None = None) -> RunView:
        records = self._records("/" + urllib.parse.quote(run, safe=""),
                                {} if job is None else {"job": job})
        return one_run(records, run, f"the ledger of the daemon at {self.url}", "daemon")

    def close(self) -> None:
        self.http.close()

    def _records(self, path: str, params: Mapping[str, Any]) -> list[RunRecord]:
        """Every page of ``/api/v1/runs{path}``, up to ``MAX_RECORDS`` records."""
        target = f"{self.url}/api/v1/runs{path}"
        records: list[RunRecord] = []
        cursors: set[str] = set()
        cursor: str | None = None
        while len(records) < MAX_RECORDS:
            query = {**params, "limit": min(MAX_LIMIT, MAX_RECORDS - len(records))}
            if cursor is not None:
                query["cursor"] = cursor
            response = self._get(target, query)
            if response.status_code == 404 and path and cursor is None:
                break
            if response.status_code != 200:
                raise DaemonError(self._failure(
                    f"the daemon at {self.url} answered {target} with HTTP "
                    f"{response.status_code}: {response.text[:300].strip()}"))
            try:
                records += [RunRecord.from_json(item) for item in response.json()]
            except (ValueError, KeyError, TypeError) as error:
                raise DaemonError(f"{target} did not answer with run records ({error}): is "
                                  f"{self.url} a trainmon daemon?") from None
            cursor = next_cursor(response)
            if cursor is None:
                break
            if cursor in cursors:
                raise DaemonError(f"{target} answered a page it had answered before: is "
                                  f"{self.url} a trainmon daemon?")
            cursors.add(cursor)
        if self.daemon is not None:
            self.daemon.confirm()
        return records

    def _get(self, target: str, query: Mapping[str, Any]) -> requests.Response:
        """One page; a ``503 busy`` asked again after its ``Retry-After``."""
        for attempt in range(BUSY_RETRIES + 1):
            try:
                response = self.http.get(target, params=dict(query), timeout=self.timeout)
            except requests.RequestException as error:
                raise DaemonError(self._failure(f"no daemon answered at {self.url} ({error})")
                                  ) from None
            if response.status_code != 503 or attempt == BUSY_RETRIES or not _busy(response):
                return response
            self._sleep(_retry_after(response))
        raise AssertionError("unreachable")  # the loop returns on its last attempt

    def _failure(self, what: str) -> str:
        if self.instead_of is None:
            return what
        return (f"no readable ledger at {self.instead_of}, and {what}; give --ledger FILE "
                "(as root or a member of group trainmon) or start the daemon")


def next_cursor(response: requests.Response) -> str | None:
    """The ``cursor`` of the answer's ``Link: <...>; rel="next"``, None on the last page."""
    link = response.links.get("next", {}).get("url")
    if not link:
        return None
    found = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query).get("cursor")
    return found[0] if found else None


def _busy(response: requests.Response) -> bool:
    try:
        return bool(response.json().get("error") == "busy")
    except (ValueError, AttributeError):
        return False


def _retry_after(response: requests.Response) -> float:
    try:
        seconds = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), MAX_RETRY_WAIT_SECONDS)


def open_daemon(url: str, note: TextIO, trust: DaemonTrust | None = None, *,
                instead_of: Path | None = None) -> DaemonSource:
    """The daemon at ``url`` as a source, once its owner is checked
    (``UntrustedDaemon`` otherwise); ``note`` gets the line naming what is read."""
    daemon = TrustedDaemon.check(url, DaemonTrust.default() if trust is None else trust)
    why = "" if instead_of is None else f"; no readable ledger at {instead_of}"
    note.write(f"trainmon: reading {daemon.describe()}{why}\n")
    return DaemonSource(url, instead_of=instead_of, daemon=daemon)


def default_source(
    ledger: Path, daemon_url: str | None, note: TextIO, trust: DaemonTrust | None = None,
) -> LocalSource | DaemonSource:
    """The ledger file when this process may read it, else the daemon at
    ``daemon_url`` (its owner checked); ``note`` gets the line that names the source."""
    if os.access(ledger, os.R_OK) or daemon_url is None:
        note.write(f"trainmon: reading the ledger {ledger}\n")
        return LocalSource(ledger)
    return open_daemon(daemon_url, note, trust, instead_of=ledger)
