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

The daemon answers with ``RunRecord.to_json`` lists (``trainmon.ledger.api``),
one record per node that saw the run: only this node's here. A daemon that
does not answer, asks for basic auth, or cannot read its ledger is a
``DaemonError`` (exit 1) that names the file it could not read either.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import requests

from trainmon.ledger.records import RunRecord
from trainmon.runs.local import LocalSource, one_run
from trainmon.runs.view import RunView

#: Seconds one request to the daemon may take.
TIMEOUT_SECONDS = 10.0


class DaemonError(Exception):
    """The daemon could not be asked, or refused (the CLI exits 1)."""


class DaemonSource:
    """``runs``/``run`` from a daemon's ``/api/v1/runs``; ``close()`` when done."""

    def __init__(self, url: str, *, session: requests.Session | None = None,
                 timeout: float = TIMEOUT_SECONDS, instead_of: Path | None = None) -> None:
        self.url = url.rstrip("/")
        self.http = session if session is not None else requests.Session()
        self.timeout = timeout
        #: The ledger file read in its place, named in errors.
        self.instead_of = instead_of

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
        target = f"{self.url}/api/v1/runs{path}"
        try:
            response = self.http.get(target, params=dict(params), timeout=self.timeout)
        except requests.RequestException as error:
            raise DaemonError(self._failure(f"no daemon answered at {self.url} ({error})")
                              ) from None
        if response.status_code == 404 and path:
            return []
        if response.status_code != 200:
            raise DaemonError(self._failure(
                f"the daemon at {self.url} answered {target} with HTTP "
                f"{response.status_code}: {response.text[:300].strip()}"))
        try:
            body = response.json()
            return [RunRecord.from_json(item) for item in body]
        except (ValueError, KeyError, TypeError) as error:
            raise DaemonError(f"{target} did not answer with run records ({error}): is "
                              f"{self.url} a trainmon daemon?") from None

    def _failure(self, what: str) -> str:
        if self.instead_of is None:
            return what
        return (f"no readable ledger at {self.instead_of}, and {what}; give --ledger FILE "
                "(as root or a member of group trainmon) or start the daemon")


def default_source(
    ledger: Path, daemon_url: str | None, note: TextIO,
) -> LocalSource | DaemonSource:
    """The ledger file when this process may read it, else the daemon at
    ``daemon_url``; ``note`` gets the line that names the source."""
    if os.access(ledger, os.R_OK) or daemon_url is None:
        note.write(f"trainmon: reading the ledger {ledger}\n")
        return LocalSource(ledger)
    note.write(f"trainmon: reading the daemon at {daemon_url} (no readable ledger at "
               f"{ledger})\n")
    return DaemonSource(daemon_url, instead_of=ledger)
