"""The node's SQLite ledger (``collectors.ledger.path``) as a source of runs.

Opened read-only: the daemon is the only writer, and a reader never blocks it
(WAL). A missing, corrupt or foreign file is a ``LedgerError`` whose message the
CLI prints as it is (exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainmon.ledger import Ledger
from trainmon.runs.view import RecordLike, RunView


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
        return one_run(self._ledger.get(run, job=job), run, f"the ledger {self.path}")

    def previous(self, view: RunView) -> RunView | None:
        """The latest earlier run of the same job and config hash, if any."""
        record = self._ledger.previous(view.job, view.config_hash, before=view.started)
        return None if record is None else RunView.from_records([record])

    def close(self) -> None:
        self._ledger.close()


def one_run(records: Sequence[RecordLike], run: str, where: str,
            source: str = "ledger") -> RunView:
    """The records of ``run`` merged into one view; ``UnknownRun`` when there are none
    (``where`` names the source) or when they belong to several jobs."""
    if not records:
        raise UnknownRun(f"run {run!r} is not in {where}")
    jobs = {record.job for record in records}
    if len(jobs) > 1:
        raise UnknownRun(f"run {run!r} belongs to several jobs ({', '.join(sorted(jobs))}): "
                         "give --job")
    return RunView.from_records(records, source=source)
