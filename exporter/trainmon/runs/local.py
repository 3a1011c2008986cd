"""The node's SQLite ledger (``collectors.ledger.path``) as a source of runs.

Opened read-only: the daemon is the only writer, and a reader never blocks it
(WAL). A missing, corrupt or foreign file is a ``LedgerError`` whose message the
CLI prints as it is (exit 2).
"""

from __future__ import annotations

from pathlib import Path

from trainmon.ledger import Ledger
from trainmon.runs.view import RunView


class UnknownRun(LookupError):
    """No source knows the run asked for."""


class LocalSource:
    """``runs``/``run`` over one ledger file; ``close()`` when done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ledger = Ledger.open(path, readonly=True)

    def runs(self, job: str | None = None, since: float | None = None) -> list[RunView]:
        """Newest first."""
        return [RunView.from_records([record])
                for record in self._ledger.runs(job=job, since=since)]

    def run(self, run: str, job: str | None = None) -> RunView:
        records = self._ledger.get(run, job=job)
        if not records:
            raise UnknownRun(f"run {run!r} is not in the ledger {self.path}")
        jobs = {record.job for record in records}
        if len(jobs) > 1:
            raise UnknownRun(f"run {run!r} belongs to several jobs ({', '.join(sorted(jobs))}): "
                             "give --job")
        return RunView.from_records(records)

    def previous(self, view: RunView) -> RunView | None:
        """The latest earlier run of the same job and config hash, if any."""
        record = self._ledger.previous(view.job, view.config_hash, before=view.started)
        return None if record is None else RunView.from_records([record])

    def close(self) -> None:
        self._ledger.close()
