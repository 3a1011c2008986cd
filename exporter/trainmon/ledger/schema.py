"""The ledger's SQLite file: how it is recognised, created and opened.

A trainmon ledger is an SQLite database whose header carries
``PRAGMA application_id`` = ``APPLICATION_ID`` ("TrMn") and
``PRAGMA user_version`` = the schema version that wrote it. Opening checks,
before anything is written:

- the file starts with the SQLite magic (``SQLite format 3\\0``): anything
  else (a log file, a truncated download, random bytes) is not a ledger;
- its ``application_id`` is ours; an SQLite file of another program (0 with
  tables in it, or another id) is foreign;
- its ``user_version`` is not newer than ``SCHEMA_VERSION`` (a downgraded
  daemon must not rewrite a newer layout).

Each failure is a ``LedgerError`` that names the path and the problem, and the
file is left exactly as it was: the checks read the header bytes themselves
and open SQLite read-only before any PRAGMA that writes. Only a missing or
empty file is created, in WAL mode.

Durability (docs/deploy.md): ``journal_mode=WAL`` with ``synchronous=NORMAL``.
A committed transaction is in the WAL before ``COMMIT`` returns, so a daemon
killed with SIGKILL loses nothing committed and at most the update it was in
the middle of; after a power loss the last transactions since the latest
WAL sync may be missing, but the file is never corrupt (SQLite replays or
discards whole transactions). Readers (``trainmon runs``, the HTTP routes)
never block the writer and wait up to ``BUSY_TIMEOUT_MS`` for a checkpoint.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

#: ``PRAGMA application_id`` of a trainmon ledger: the bytes "TrMn".
APPLICATION_ID = 0x54724D6E
#: ``PRAGMA user_version``: the layout of the tables below.
SCHEMA_VERSION = 1
#: How long a reader or the writer waits for a lock held by the other (ms).
BUSY_TIMEOUT_MS = 5000
SQLITE_MAGIC = b"SQLite format 3\x00"

#: One row per (job, run, node): description and summary as JSON text; ``state``
#: holds the recorder's accumulators so a restarted daemon resumes a run.
TABLES = (
    """CREATE TABLE runs (
        job TEXT NOT NULL,
        run TEXT NOT NULL,
        node TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        started REAL NOT NULL,
        ended REAL,
        end_reason TEXT,
        updated REAL NOT NULL,
        world_size INTEGER,
        ranks INTEGER NOT NULL,
        description TEXT NOT NULL,
        summary TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (job, run, node)
    )""",
    "CREATE INDEX runs_by_job_started ON runs (job, started)",
    "CREATE INDEX runs_by_started ON runs (started)",
)


class LedgerError(Exception):
    """The ledger file cannot be used: missing (read-only open), foreign, newer or corrupt."""


def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    """An open, verified connection to the ledger at ``path``.

    ``readonly``: the file must exist. Otherwise a missing or empty file is
    created with the schema (its directory must exist: OSError-like failures
    surface as ``sqlite3.OperationalError`` from ``sqlite3``, wrapped in
    ``LedgerError`` with ``missing_directory`` or the SQLite message).
    """
    exists = path.exists()
    if readonly and not exists:
        raise LedgerError(f"no ledger at {path}")
    if exists and not path.is_file():
        raise LedgerError(f"{path} is not a regular file")
    fresh = not exists or path.stat().st_size == 0
    if readonly and fresh:
        raise LedgerError(f"{path} is empty: no run recorded yet")
    if not fresh:
        _check_magic(path)
        _verify(path)
    if readonly:
        connection = _open(path, "ro")
    else:
        if not path.parent.is_dir():
            raise LedgerError(f"directory {path.parent} does not exist")
        connection = _open(path, "rwc")
        try:
            if fresh:
                _create(connection)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as error:
            connection.close()
            raise LedgerError(f"cannot initialise the ledger {path}: {error}") from None
    return connection


def _open(path: Path, mode: str) -> sqlite3.Connection:
    uri = f"{path.resolve().as_uri()}?mode={mode}"
    try:
        # One thread at a time, not always the same one: the recorder opens at
        # start and writes from its thread, under its own lock.
        connection = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                                     isolation_level=None, check_same_thread=False)
    except sqlite3.Error as error:
        raise LedgerError(f"cannot open the ledger {path}: {error}") from None
    connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return connection


def _check_magic(path: Path) -> None:
    try:
        with path.open("rb") as file:
            header = file.read(len(SQLITE_MAGIC))
    except OSError as error:
        raise LedgerError(f"cannot read {path}: {error.strerror or error}") from None
    if header != SQLITE_MAGIC:
        raise LedgerError(f"{path} is not an SQLite database (not a trainmon ledger); "
                          "left untouched: move it away or set collectors.ledger.path")


def _verify(path: Path) -> None:
    """Application id, schema version and integrity, on a read-only connection."""
    connection = _open(path, "ro")
    try:
        application_id = connection.execute("PRAGMA application_id").fetchone()[0]
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if application_id != APPLICATION_ID:
            raise LedgerError(
                f"{path} is an SQLite database of another program (application_id "
                f"{application_id:#x}, a trainmon ledger has {APPLICATION_ID:#x}); left "
                "untouched: move it away or set collectors.ledger.path")
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"{path} has ledger schema {version}, newer than this trainmon's "
                f"{SCHEMA_VERSION}; left untouched: upgrade trainmon")
        problems = [row[0] for row in connection.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise LedgerError(f"{path} is corrupt ({'; '.join(problems)}); left untouched")
    except sqlite3.DatabaseError as error:
        raise LedgerError(f"{path} is not a readable trainmon ledger: {error}") from None
    finally:
        connection.close()


def _create(connection: sqlite3.Connection) -> None:
    connection.execute("BEGIN IMMEDIATE")
    try:
        for statement in TABLES:
            connection.execute(statement)
        connection.execute(f"PRAGMA application_id={APPLICATION_ID}")
        connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except sqlite3.Error:
        connection.execute("ROLLBACK")
        raise
