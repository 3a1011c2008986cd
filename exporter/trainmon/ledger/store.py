"""``Ledger``: the run history on this node, read by the CLI and written by the recorder.

Readers (``trainmon runs``/``compare``, ``doctor``, ``GET /api/v1/runs``) open it
with ``Ledger.open(path, readonly=True)``; the daemon's recorder
(``trainmon.ledger.recorder``) is the one writer, from its own thread, with
one short transaction per flush (``write``) so that a reader waits at most
one flush.

Owners: every row carries the writer identity its run belonged to. ``write``
never changes a row whose owner is another non-empty identity (it reports
the record as refused instead); a row without owner (schema 1) is claimed
by the next writer of that (job, run, node).

Retention (``prune``), once an hour: ended runs older than
``retention_days``; then each owner's oldest runs beyond
``max_runs_per_owner`` (rows without owner exempt); then, while more than
``max_runs`` remain, the oldest runs of the owner holding the most rows, so
one user's thousands of runs never push out another user's history.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmon.ledger.files import CheckedFile, release
from trainmon.ledger.records import COLUMNS, RunRecord
from trainmon.ledger.schema import LedgerError, connect, describe_error

log = logging.getLogger(__name__)

#: (job, run, node) of a row.
RowKey = tuple[str, str, str]
#: A record's place in the order runs are listed, newest first: (started, run, job, node),
#: unique (the row key is in it) and unchanged while the record lives.
RunKey = tuple[float, str, str, str]


#: Free pages worth ``Ledger.reclaim``'s ``VACUUM`` (bytes), when also a quarter of the file.
RECLAIM_MIN_FREE_BYTES = 4 << 20


@dataclass(frozen=True)
class RecordUpdate:
    """A record to write, with the recorder's state to resume it after a restart."""

    record: RunRecord
    state: Mapping[str, object]


@dataclass(frozen=True)
class WriteResult:
    """What one ``Ledger.write`` did."""

    #: Rows inserted or updated.
    written: int
    #: Records not written because their row belongs to another owner, with that owner.
    refused: tuple[tuple[RowKey, str], ...] = ()
    #: Rows deleted because their owner went past ``max_runs_per_owner``.
    owner_limit: int = 0


@dataclass(frozen=True)
class Pruned:
    """Rows one ``Ledger.prune`` deleted, per rule."""

    #: Ended runs past ``retention_seconds``.
    age: int = 0
    #: Runs beyond ``max_runs_per_owner`` of their owner.
    owner_limit: int = 0
    #: Runs beyond ``max_runs`` (from the owners with the most rows).
    max_runs: int = 0
    #: Deleted per owner (every rule).
    by_owner: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.age + self.owner_limit + self.max_runs


class Ledger:
    """An open ledger file; use from one thread (readers open their own)."""

    def __init__(self, path: Path, connection: sqlite3.Connection, readonly: bool,
                 version: int, checked: CheckedFile | None = None) -> None:
        self.path = path
        self.readonly = readonly
        #: Schema version of the file (1: no owners, read as ``""``).
        self.version = version
        self._connection = connection
        self._checked = checked
        columns = [name if name != "owner" or version >= 2 else "'' AS owner"
                   for name in COLUMNS]
        self._select_sql = f"SELECT {', '.join(columns)} FROM runs"
        self._select_state_sql = f"SELECT {', '.join(columns)}, state FROM runs"

    @classmethod
    def open(cls, path: Path | str, readonly: bool = True,
             owners: Collection[int] | None = None) -> Ledger:
        """Open (and, writable, create or upgrade) the ledger; ``LedgerError`` if it is
        not usable, also when its folders or the file could be changed or swapped by
        a user other than ``owners`` (default: root and this process's user; readers
        also the service user; ``trainmon.ledger.files``): a reader never serves a
        symlinked, swapped or foreign file."""
        path = Path(path)
        connection, version, checked = connect(path, readonly=readonly, owners=owners)
        return cls(path, connection, readonly, version, checked)

    def close(self) -> None:
        """Close the connection, then the descriptors held for it (when no other ledger
        of this process has the file open); safe to call twice."""
        self._connection.close()
        if self._checked is not None:
            release(self._checked)
            self._checked = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- reading ----------------------------------------------------------------

    def runs(self, job: str | None = None, since: float | None = None) -> list[RunRecord]:
        """Runs of ``job`` (all jobs without one) started at or after ``since``, newest first."""
        return list(self.each_run(job=job, since=since))

    def each_run(self, job: str | None = None, since: float | None = None,
                 run: str | None = None, after: RunKey | None = None) -> Iterator[RunRecord]:
        """``runs`` (of run id ``run`` only, if given) one row at a time, in the order of
        ``RunKey``, newest first, from the first record past ``after``: a keyset page
        goes on where the previous one ended, whatever was inserted since, and the
        caller holds only the records it keeps. Read it before the ledger is closed."""
        clauses, parameters = _filters(job, since)
        if run is not None:
            clauses.append("run = ?")
            parameters.append(run)
        if after is not None:
            clauses.append("(started, run, job, node) < (?, ?, ?, ?)")
            parameters.extend(after)
        sql = (self._select_sql + _where(clauses)
               + " ORDER BY started DESC, run DESC, job DESC, node DESC")
        try:
            for row in self._connection.execute(sql, parameters):
                yield RunRecord.from_row(row)
        except sqlite3.Error as error:
            raise LedgerError.of(f"cannot read the ledger {self.path}", error) from None
        except (ValueError, KeyError, TypeError) as error:
            raise LedgerError(f"the ledger {self.path} holds a malformed record: {error}") \
                from None

    def get(self, run: str, job: str | None = None) -> list[RunRecord]:
        """Every record of run ``run`` (one per node that saw it; locally one per job)."""
        clauses, parameters = _filters(job, None)
        return self._select(f"{self._select_sql}{_where([*clauses, 'run = ?'])} ORDER BY node",
                            [*parameters, run])

    def previous(self, job: str, config_hash: str | None, before: float) -> RunRecord | None:
        """The latest run of ``job`` started before ``before`` (with ``config_hash`` if given)."""
        sql = f"{self._select_sql} WHERE job = ? AND started < ?"
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

    def owner(self, job: str, run: str, node: str) -> str | None:
        """The owner stored with a record (``""``: none recorded), or None without one."""
        if self.version < 2:
            rows = self._query("SELECT '' FROM runs WHERE job = ? AND run = ? AND node = ?",
                               [job, run, node])
        else:
            rows = self._query("SELECT owner FROM runs WHERE job = ? AND run = ? AND node = ?",
                               [job, run, node])
        return None if not rows else str(rows[0][0])

    def unfinished(self, node: str, limit: int) -> list[tuple[str, str, str]]:
        """(job, run, owner) of at most ``limit`` runs of ``node`` that the file holds as
        going on (no end reason, or ``stalled``), the latest updated first."""
        owner = "owner" if self.version >= 2 else "''"
        return [(str(job), str(run), str(who)) for job, run, who in self._query(
            f"SELECT job, run, {owner} FROM runs WHERE node = ? AND (end_reason IS NULL "
            "OR end_reason = 'stalled') ORDER BY updated DESC LIMIT ?", [node, limit])]

    def stored(self, job: str, run: str, node: str
               ) -> tuple[RunRecord, Mapping[str, object]] | None:
        """The record of (``job``, ``run``, ``node``) with the recorder state stored with it,
        or None."""
        rows = self._query(self._select_state_sql + " WHERE job = ? AND run = ? AND node = ?",
                           [job, run, node])
        if not rows:
            return None
        try:
            record = RunRecord.from_row(rows[0][:-1])
            state = json.loads(rows[0][-1])
        except (ValueError, KeyError, TypeError) as error:
            raise LedgerError(f"the ledger {self.path} holds a malformed record: {error}") \
                from None
        return record, state if isinstance(state, dict) else {}

    def owners(self) -> dict[str, int]:
        """Rows per owner."""
        if self.version < 2:
            return {"": self.count()} if self.count() else {}
        return {str(owner): int(count) for owner, count
                in self._query("SELECT owner, count(*) FROM runs GROUP BY owner", [])}

    # -- writing (the recorder) ---------------------------------------------------

    def write(self, updates: Iterable[RecordUpdate],
              max_runs_per_owner: int | None = None) -> WriteResult:
        """Insert or update the given records in one transaction, except those whose row
        belongs to another non-empty owner (``WriteResult.refused``); an owner that
        holds more than ``max_runs_per_owner`` rows then loses its oldest, in the same
        transaction (``prune``'s rule, kept at every write: one writer's rows, and so
        its share of the file, stay bounded between two retention passes)."""
        pending = list(updates)
        if not pending:
            return WriteResult(0)
        placeholders = ", ".join("?" * (len(COLUMNS) + 1))
        assignments = ", ".join(f"{name} = excluded.{name}"
                                for name in (*COLUMNS[3:], "state"))
        # The WHERE keeps the owner rule even if a row appeared since the check.
        sql = (f"INSERT INTO runs ({', '.join(COLUMNS)}, state) VALUES ({placeholders}) "
               f"ON CONFLICT (job, run, node) DO UPDATE SET {assignments} "
               "WHERE runs.owner IN ('', excluded.owner)")
        refused: list[tuple[RowKey, str]] = []
        written = owner_limit = 0

        def upsert() -> None:
            nonlocal written, owner_limit
            rows = []
            for update in pending:
                record = update.record
                stored = self._connection.execute(
                    "SELECT owner FROM runs WHERE job = ? AND run = ? AND node = ?",
                    [record.job, record.run, record.node]).fetchone()
                if stored is not None and stored[0] not in ("", record.owner):
                    refused.append(((record.job, record.run, record.node), str(stored[0])))
                else:
                    rows.append(_row(update))
            if rows:
                self._connection.executemany(sql, rows)
            written = len(rows)
            if max_runs_per_owner is not None:
                for owner in {update.record.owner for update in pending} - {""}:
                    owner_limit += self._keep_newest(owner, max_runs_per_owner)

        self._transaction(upsert)
        return WriteResult(written, tuple(refused), owner_limit)

    def _keep_newest(self, owner: str, count: int) -> int:
        """Delete ``owner``'s rows but its newest ``count`` (by start); how many went."""
        cursor = self._connection.execute(
            "DELETE FROM runs WHERE rowid IN (SELECT rowid FROM runs WHERE owner = ? "
            "ORDER BY started DESC, run DESC LIMIT -1 OFFSET ?)", [owner, count])
        return max(cursor.rowcount, 0)

    def reclaim(self, min_free_bytes: int = RECLAIM_MIN_FREE_BYTES) -> int:
        """Give the space of deleted rows back to the filesystem: ``VACUUM`` when at
        least ``min_free_bytes`` and a quarter of the file are free pages (SQLite
        reuses them, but never shrinks the file by itself), and a truncating
        checkpoint of the write-ahead log. The bytes given back."""
        if self.readonly:
            raise LedgerError(f"{self.path} is open read-only")
        try:
            page_size = self._connection.execute("PRAGMA page_size").fetchone()[0]
            pages = self._connection.execute("PRAGMA page_count").fetchone()[0]
            free = self._connection.execute("PRAGMA freelist_count").fetchone()[0]
            reclaimed = 0
            if free * page_size >= min_free_bytes and free * 4 >= pages:
                self._connection.execute("VACUUM")
                reclaimed = free * page_size
            self._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as error:
            raise LedgerError.of(f"cannot reclaim the space of {self.path}", error) from None
        return int(reclaimed)

    def prune(self, *, now: float, retention_seconds: float, max_runs: int,
              max_runs_per_owner: int | None = None) -> Pruned:
        """Drop ended runs last updated before ``now - retention_seconds``; then each
        owner's oldest runs beyond ``max_runs_per_owner`` (not rows without owner);
        then, while more than ``max_runs`` remain, the oldest runs of the owner with the
        most rows (ties: by owner name). One transaction."""
        result = Pruned()

        def delete() -> None:
            nonlocal result
            by_owner: dict[str, int] = {}
            before = self.owners()
            cursor = self._connection.execute(
                "DELETE FROM runs WHERE ended IS NOT NULL AND updated < ?",
                [now - retention_seconds])
            age = max(cursor.rowcount, 0)
            owner_limit = 0
            if max_runs_per_owner is not None:
                cursor = self._connection.execute(
                    "DELETE FROM runs WHERE rowid IN (SELECT rowid FROM (SELECT rowid, "
                    "row_number() OVER (PARTITION BY owner ORDER BY started DESC, run DESC) "
                    "AS position FROM runs WHERE owner != '') WHERE position > ?)",
                    [max_runs_per_owner])
                owner_limit = max(cursor.rowcount, 0)
            counts = self.owners()
            over = 0
            for owner, quota in fair_share(counts, max_runs).items():
                cursor = self._connection.execute(
                    "DELETE FROM runs WHERE rowid IN (SELECT rowid FROM runs WHERE owner = ? "
                    "ORDER BY started ASC, run ASC LIMIT ?)", [owner, quota])
                over += max(cursor.rowcount, 0)
            after = self.owners()
            for owner, count in before.items():
                if count > after.get(owner, 0):
                    by_owner[owner] = count - after.get(owner, 0)
            result = Pruned(age, owner_limit, over, by_owner)

        self._transaction(delete)
        return result

    # -- plumbing -------------------------------------------------------------------

    def _transaction(self, work: Callable[[], object]) -> None:
        """``work`` between BEGIN IMMEDIATE and COMMIT; rolled back on failure unless
        SQLite already did (it does on SQLITE_FULL, most I/O errors, SQLITE_NOMEM)."""
        if self.readonly:
            raise LedgerError(f"{self.path} is open read-only")
        connection = self._connection
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                work()
                connection.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        except sqlite3.Error as error:
            raise LedgerError.of(f"cannot write the ledger {self.path}", error) from None

    def _rollback(self) -> None:
        """ROLLBACK what is still open; a failure to do so is logged, not raised over the
        error that caused it (the next BEGIN fails and says so if it matters)."""
        if not self._connection.in_transaction:
            return
        try:
            self._connection.execute("ROLLBACK")
        except sqlite3.Error as error:
            log.warning("run ledger %s: rollback failed: %s", self.path, describe_error(error))

    def _query(self, sql: str, parameters: list[object]) -> list[tuple[Any, ...]]:
        try:
            return list(self._connection.execute(sql, parameters))
        except sqlite3.Error as error:
            raise LedgerError.of(f"cannot read the ledger {self.path}", error) from None

    def _select(self, sql: str, parameters: list[object]) -> list[RunRecord]:
        try:
            return [RunRecord.from_row(row) for row in self._query(sql, parameters)]
        except (ValueError, KeyError, TypeError) as error:
            raise LedgerError(f"the ledger {self.path} holds a malformed record: {error}") \
                from None


def _where(clauses: list[str]) -> str:
    return " WHERE " + " AND ".join(clauses) if clauses else ""


def _filters(job: str | None, since: float | None) -> tuple[list[str], list[object]]:
    """The conditions (and their parameters) of a ``job`` and a ``since`` filter."""
    clauses: list[str] = []
    parameters: list[object] = []
    if job is not None:
        clauses.append("job = ?")
        parameters.append(job)
    if since is not None:
        clauses.append("started >= ?")
        parameters.append(since)
    return clauses, parameters


def _row(update: RecordUpdate) -> tuple[object, ...]:
    record = update.record
    return (record.job, record.run, record.node, record.config_hash, record.started,
            record.ended, record.end_reason, record.updated, record.world_size, record.ranks,
            json.dumps(record.description, sort_keys=True, separators=(",", ":")),
            json.dumps(record.summary, sort_keys=True, separators=(",", ":")),
            record.owner,
            json.dumps(update.state, sort_keys=True, separators=(",", ":")))


def fair_share(counts: Mapping[str, int], limit: int) -> dict[str, int]:
    """Rows to delete per owner so that at most ``limit`` remain: always from the owners
    holding the most, levelling them down together (ties broken by owner name)."""
    remaining = {owner: count for owner, count in counts.items() if count > 0}
    excess = sum(remaining.values()) - limit
    quotas: dict[str, int] = {}
    while excess > 0 and remaining:  # at most one pass per distinct count
        top = max(remaining.values())
        leaders = sorted(owner for owner, count in remaining.items() if count == top)
        below = max((count for count in remaining.values() if count < top), default=0)
        room = (top - below) * len(leaders)
        if room >= excess:
            each, extra = divmod(excess, len(leaders))
            for index, owner in enumerate(leaders):
                quotas[owner] = quotas.get(owner, 0) + each + (1 if index < extra else 0)
            break
        for owner in leaders:
            quotas[owner] = quotas.get(owner, 0) + top - below
            remaining[owner] = below
        excess -= room
        remaining = {owner: count for owner, count in remaining.items() if count > 0}
    return quotas
