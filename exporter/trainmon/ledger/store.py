"""``Ledger``: the run history on this node, read by the CLI and written by the recorder.

Readers (``trainmon runs``/``compare``, ``doctor``, ``GET /api/v1/runs``) open it
with ``Ledger.open(path, readonly=True)``; the daemon's recorder
(``trainmon.collectors.ledger``) is the one writer, from its own thread, with
one short transaction per flush (``write``) so that a reader waits at most
one flush. Retention (``prune``) drops ended runs older than
``retention_days`` and then the oldest runs beyond ``max_runs``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmon.ledger.records import COLUMNS, RunRecord
from trainmon.ledger.schema import LedgerError, connect

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM runs"


@dataclass(frozen=True)
class RecordUpdate:
    """A record to write, with the recorder's state to resume it after a restart."""

    record: RunRecord
    state: Mapping[str, object]


class Ledger:
    """An open ledger file; use from one thread (readers open their own)."""

    def __init__(self, path: Path, connection: sqlite3.Connection, readonly: bool) -> None:
        self.path = path
        self.readonly = readonly
        self._connection = connection

    @classmethod
    def open(cls, path: Path | str, readonly: bool = True) -> Ledger:
        """Open (and, writable, create) the ledger; ``LedgerError`` if it is not usable."""
        path = Path(path)
        return cls(path, connect(path, readonly=readonly), readonly)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------

    def runs(self, job: str | None = None, since: float | None = None) -> list[RunRecord]:
        """Runs of ``job`` (all jobs without one) started at or after ``since``, newest first."""
        where, parameters = _filters(job, since)
        return self._select(f"{_SELECT}{where} ORDER BY started DESC, run DESC", parameters)

    def get(self, run: str, job: str | None = None) -> list[RunRecord]:
        """Every record of run ``run`` (one per node that saw it; locally one per job)."""
        where, parameters = _filters(job, None)
        clause = " AND run = ?" if where else " WHERE run = ?"
        return self._select(f"{_SELECT}{where}{clause} ORDER BY node",
                            [*parameters, run])

    def previous(self, job: str, config_hash: str | None, before: float) -> RunRecord | None:
        """The latest run of ``job`` started before ``before`` (with ``config_hash`` if given)."""
        sql = f"{_SELECT} WHERE job = ? AND started < ?"
        parameters: list[object] = [job, before]
        if config_hash is not None:
            sql += " AND config_hash = ?"
            parameters.append(config_hash)
        found = self._select(sql + " ORDER BY started DESC LIMIT 1", parameters)
        return found[0] if found else None

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM runs", [])[0][0])

    def state(self, job: str, run: str, node: str) -> Mapping[str, object] | None:
        """The recorder state stored with a record, or None."""
        rows = self._query("SELECT state FROM runs WHERE job = ? AND run = ? AND node = ?",
                           [job, run, node])
        if not rows:
            return None
        value = json.loads(rows[0][0])
        return value if isinstance(value, dict) else None

    # -- writing (the recorder) ---------------------------------------------------

    def write(self, updates: Iterable[RecordUpdate]) -> int:
        """Insert or replace the given records in one transaction; the rows written."""
        rows = [_row(update) for update in updates]
        if not rows:
            return 0
        placeholders = ", ".join("?" * (len(COLUMNS) + 1))
        assignments = ", ".join(f"{name} = excluded.{name}"
                                for name in (*COLUMNS[3:], "state"))
        sql = (f"INSERT INTO runs ({', '.join(COLUMNS)}, state) VALUES ({placeholders}) "
               f"ON CONFLICT (job, run, node) DO UPDATE SET {assignments}")
        self._transaction(lambda: self._connection.executemany(sql, rows))
        return len(rows)

    def prune(self, *, now: float, retention_seconds: float, max_runs: int) -> int:
        """Drop ended runs last updated before ``now - retention_seconds``, then the oldest
        runs beyond ``max_runs``; the rows deleted."""
        deleted = 0

        def delete() -> None:
            nonlocal deleted
            cursor = self._connection.execute(
                "DELETE FROM runs WHERE ended IS NOT NULL AND updated < ?",
                [now - retention_seconds])
            deleted = cursor.rowcount
            cursor = self._connection.execute(
                "DELETE FROM runs WHERE rowid IN (SELECT rowid FROM runs "
                "ORDER BY started DESC LIMIT -1 OFFSET ?)", [max_runs])
            deleted += cursor.rowcount

        self._transaction(delete)
        return deleted

    # -- plumbing -------------------------------------------------------------------

    def _transaction(self, work: Callable[[], object]) -> None:
        if self.readonly:
            raise LedgerError(f"{self.path} is open read-only")
        try:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                work()
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            self._connection.execute("COMMIT")
        except sqlite3.Error as error:
            raise LedgerError(f"cannot write the ledger {self.path}: {error}") from None

    def _query(self, sql: str, parameters: list[object]) -> list[tuple[Any, ...]]:
        try:
            return list(self._connection.execute(sql, parameters))
        except sqlite3.Error as error:
            raise LedgerError(f"cannot read the ledger {self.path}: {error}") from None

    def _select(self, sql: str, parameters: list[object]) -> list[RunRecord]:
        try:
            return [RunRecord.from_row(row) for row in self._query(sql, parameters)]
        except (ValueError, KeyError, TypeError) as error:
            raise LedgerError(f"the ledger {self.path} holds a malformed record: {error}") \
                from None


def _filters(job: str | None, since: float | None) -> tuple[str, list[object]]:
    clauses: list[str] = []
    parameters: list[object] = []
    if job is not None:
        clauses.append("job = ?")
        parameters.append(job)
    if since is not None:
        clauses.append("started >= ?")
        parameters.append(since)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), parameters


def _row(update: RecordUpdate) -> tuple[object, ...]:
    record = update.record
    return (record.job, record.run, record.node, record.config_hash, record.started,
            record.ended, record.end_reason, record.updated, record.world_size, record.ranks,
            json.dumps(record.description, sort_keys=True, separators=(",", ":")),
            json.dumps(record.summary, sort_keys=True, separators=(",", ":")),
            json.dumps(update.state, sort_keys=True, separators=(",", ":")))
