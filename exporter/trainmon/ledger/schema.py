"""The ledger's SQLite file: how it is recognised, created, upgraded and opened.

A trainmon ledger is an SQLite database whose header carries
``PRAGMA application_id`` = ``APPLICATION_ID`` ("TrMn") and
``PRAGMA user_version`` = the schema version that wrote it. Opening checks,
before anything is written, on a read-only SQLite connection:

- SQLite recognises the file (``SQLITE_NOTADB`` otherwise: a log file, a
  truncated download, random bytes are not a ledger);
- its ``application_id`` is ours; an SQLite file of another program (0 with
  tables in it, or another id) is foreign;
- its ``user_version`` is not newer than ``SCHEMA_VERSION`` (a downgraded
  daemon must not rewrite a newer layout);
- for a writer (the daemon, once at open), ``PRAGMA quick_check`` finds no
  corruption. Readers skip it: it reads the whole file (0.13 s for 250 MB),
  and ``GET /api/v1/runs`` opens the file for every page; a reader meets a
  corrupt page as an error of its query.

Each failure is a ``LedgerError`` that names the path and the problem, and the
file is left exactly as it was. Only a missing or empty file is created, in
WAL mode, with ``FILE_MODE`` (0640) and, where the group exists, group
``LEDGER_GROUP``; an existing file (and its ``-wal``/``-shm``) readable or
writable by others is tightened to that mode, once, with a log line. SQLite
gives its ``-wal`` and ``-shm`` files the database file's mode and owner.

Before SQLite sees it (``trainmon.ledger.files``): the path's folders are
checked from ``/`` down (root's or the daemon's, writable by no one else),
and the file is opened without following a symlink and refused when it is
not a regular file of one link owned by root or the daemon's user (readers:
also the service user); after SQLite opened it, the path must still name
that file. Mode and group are set on the daemon's own descriptors
(``fchmod``/``fchown``), which it holds while any connection of this process
has the file open: closing a descriptor would drop SQLite's POSIX locks
(``trainmon.ledger.files`` says why that matters).

Schema versions: 1 (the first release of the ledger) had no ``owner`` column; 2 adds ``owner``
(the writer identity of the run, ``trainmon.training.writers``; ``''`` for
rows written before); 3 renames the end reason ``vanished`` to ``lost``
(``trainmon.ledger.records.END_REASONS``). An older file opened writable is
first copied whole to ``<file>.schema-<N>.bak`` beside it (``back_up``: written
as ``.partial``, synced, then renamed, so it is whole or absent; a disk with no
room for it leaves the file unmigrated and the error reported), then upgraded
in place in one transaction (``migrate``); opened read-only it is
read as it is, every owner ``''`` in a version 1 file, and ``vanished`` read as
``lost`` (``RunRecord.from_json``).

Durability (docs/deploy.md): ``journal_mode=WAL`` with ``synchronous=NORMAL``.
A committed transaction is in the WAL before ``COMMIT`` returns, so a daemon
killed with SIGKILL loses nothing committed and at most the update it was in
the middle of; after a power loss the last transactions since the latest
WAL sync may be missing, but the file is never corrupt (SQLite replays or
discards whole transactions). Readers (``trainmon runs``, the HTTP routes)
never block the writer and wait up to ``BUSY_TIMEOUT_MS`` for a checkpoint.
"""

from __future__ import annotations

import grp
import logging
import os
import sqlite3
import stat
from collections.abc import Callable, Collection
from pathlib import Path

from trainmon.ledger.files import (
    CheckedFile,
    UnsafeLedgerFile,
    WriterLock,
    check_readable,
    check_writable,
    confirm,
    lock_writer,
    release,
)
from trainmon.ledger.files import _cannot as cannot_use
from trainmon.paths import reader_owners, trusted_owners

log = logging.getLogger(__name__)

#: ``PRAGMA application_id`` of a trainmon ledger: the bytes "TrMn".
APPLICATION_ID = 0x54724D6E
#: ``PRAGMA user_version``: the layout of the tables below.
SCHEMA_VERSION = 3
#: How long a reader or the writer waits for a lock held by the other (ms).
BUSY_TIMEOUT_MS = 5000
#: Mode of the ledger file (and so of its ``-wal``/``-shm``): owner rw, group r.
FILE_MODE = 0o640
#: Bits a ledger file must not have: group write, anything for others.
LOOSE_BITS = stat.S_IWGRP | stat.S_IRWXO
#: Mode of the copy made before an upgrade (``back_up``): the daemon's user only.
BACKUP_MODE = 0o600
#: The group given the ledger file when it exists (docs/deploy.md: readers of the ledger).
LEDGER_GROUP = "trainmon"

#: One row per (job, run, node): description and summary as JSON text; ``state``
#: holds the recorder's accumulators so a restarted daemon resumes a run;
#: ``owner`` the writer identity the run belongs to.
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
        owner TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (job, run, node)
    )""",
    "CREATE INDEX runs_by_job_started ON runs (job, started)",
    "CREATE INDEX runs_by_started ON runs (started)",
    "CREATE INDEX runs_by_owner_started ON runs (owner, started)",
)
#: Statements that take a file of version ``key`` to version ``key + 1``.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX runs_by_owner_started ON runs (owner, started)"),
    2: ("UPDATE runs SET end_reason = 'lost' WHERE end_reason = 'vanished'",),
}
#: What SQLite's primary result codes mean for the ledger: the ``LedgerError.reason``
#: (the recorder's error counter label) and the words of the message.
_CODES: dict[str, tuple[str, str]] = {
    "SQLITE_FULL": ("disk_full", "the disk is full"),
    "SQLITE_READONLY": ("read_only", "the file or its filesystem is read-only"),
    "SQLITE_IOERR": ("io_error", "I/O error"),
    "SQLITE_CANTOPEN": ("other", "cannot open the file or its -wal/-shm"),
    "SQLITE_BUSY": ("busy", "locked by another writer"),
    "SQLITE_CORRUPT": ("corrupt", "the file is corrupt"),
}
#: The -shm file could not grow: ENOSPC, whatever the primary code says.
_SHM_FULL = ("disk_full", "the disk is full (the -shm file cannot grow)")
#: SQLite's message of each primary result code (``sqlite3_errstr``), for Python 3.10,
#: whose exceptions lack ``sqlite_errorname``.
_MESSAGES = {
    "database or disk is full": "SQLITE_FULL",
    "attempt to write a readonly database": "SQLITE_READONLY",
    "disk I/O error": "SQLITE_IOERR",
    "unable to open database file": "SQLITE_CANTOPEN",
    "database is locked": "SQLITE_BUSY",
    "database disk image is malformed": "SQLITE_CORRUPT",
    "file is not a database": "SQLITE_NOTADB",
}


class LedgerError(Exception):
    """The ledger file cannot be used: missing (read-only open), foreign, newer or corrupt.

    ``reason``: ``disk_full``, ``read_only``, ``io_error``, ``busy``, ``corrupt``
    or ``other``, for the recorder's error counter; ``locked`` when another daemon
    holds the writer lock (``take_writer_lock``).
    """

    def __init__(self, message: str, reason: str = "other") -> None:
        super().__init__(message)
        self.reason = reason

    @classmethod
    def of(cls, what: str, error: sqlite3.Error) -> LedgerError:
        """``what`` failed with ``error``: "cannot write …: the disk is full (SQLITE_FULL: …)"."""
        reason, words = _meaning(error)
        return cls(f"{what}: {words}", reason)


def error_name(error: sqlite3.Error) -> str:
    """The SQLite result code name of ``error`` (``SQLITE_IOERR_WRITE``), or ``""``."""
    name = getattr(error, "sqlite_errorname", None)
    if isinstance(name, str):
        return name
    return _MESSAGES.get(str(error), "")


def describe_error(error: sqlite3.Error) -> str:
    """``error`` in words: "the disk is full (SQLITE_FULL: database or disk is full)"."""
    return _meaning(error)[1]


def _meaning(error: sqlite3.Error) -> tuple[str, str]:
    """The ``LedgerError.reason`` of ``error`` and its message in words."""
    name = error_name(error)
    if name == "SQLITE_IOERR_SHMSIZE":
        reason, words = _SHM_FULL
    else:
        primary = next((code for code in _CODES
                        if name == code or name.startswith(code + "_")), None)
        if primary is None:
            return "other", str(error)
        reason, words = _CODES[primary]
    return reason, f"{words} ({name}: {error})"


def connect(
    path: Path, *, readonly: bool, owners: Collection[int] | None = None,
) -> tuple[sqlite3.Connection, int, CheckedFile]:
    """An open, verified connection to the ledger at ``path``, its schema version and
    the checked file (``release`` it when the connection is closed).

    ``readonly``: the file must exist. Otherwise a missing or empty file is
    created with the schema, and a file of an older schema is backed up
    (``back_up``) and upgraded (its directory must exist). ``owners``: the uids
    that may own the file and its folders (default: root and this process's
    user; readers also the service user, ``trainmon.paths.reader_owners``).
    """
    if owners is None:
        owners = reader_owners() if readonly else trusted_owners()
    try:
        checked = (check_readable(path, owners) if readonly
                   else check_writable(path, owners, FILE_MODE))
    except UnsafeLedgerFile as error:
        raise LedgerError(str(error), error.reason) from None
    except OSError as error:
        raise _os_error(f"cannot open the ledger {path}", error) from None
    try:
        connection, version = _connect_checked(path, checked, readonly)
    except BaseException:
        release(checked)
        raise
    return connection, version, checked


def take_writer_lock(path: Path, owners: Collection[int] | None = None) -> WriterLock:
    """The exclusive writer lock of the ledger at ``path`` (``trainmon.ledger.files``,
    ``lock_writer``), which the recording daemon takes before it opens the file and holds
    until it closes it; ``LedgerError`` (reason ``locked``, naming the holder) when
    another process holds it. ``owners`` as for ``connect``; readers never take it."""
    try:
        return lock_writer(path, trusted_owners() if owners is None else owners, FILE_MODE)
    except UnsafeLedgerFile as error:
        raise LedgerError(str(error), error.reason) from None
    except OSError as error:
        raise LedgerError(f"cannot lock the ledger {path}: {error.strerror or error}") \
            from None


def _connect_checked(path: Path, checked: CheckedFile,
                     readonly: bool) -> tuple[sqlite3.Connection, int]:
    if readonly and checked.fresh:
        raise LedgerError(f"{path} is empty: no run recorded yet")
    version = SCHEMA_VERSION
    if not checked.fresh:
        version = _verify(checked.path, path, integrity=not readonly)
    if readonly:
        connection = _open(checked.path, path, "ro")
        _confirm(connection, checked, path)
        return connection, version
    if checked.fresh:
        restrict(checked)
    tighten(checked)
    if version < SCHEMA_VERSION:
        back_up(checked.path, path, version)
    connection = _open(checked.path, path, "rwc")
    _confirm(connection, checked, path)
    try:
        if checked.fresh:
            _create(connection)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        if version < SCHEMA_VERSION:
            migrate(connection, version)
            log.info("run ledger %s upgraded from schema %d to %d", path, version,
                     SCHEMA_VERSION)
            version = SCHEMA_VERSION
    except sqlite3.Error as error:
        connection.close()
        raise LedgerError.of(f"cannot initialise the ledger {path}", error) from None
    return connection, version


def _confirm(connection: sqlite3.Connection, checked: CheckedFile, path: Path) -> None:
    """SQLite opened the checked file, or the connection is closed and ``LedgerError``."""
    try:
        confirm(checked, path)
    except UnsafeLedgerFile as error:
        connection.close()
        raise LedgerError(str(error), error.reason) from None


def restrict(checked: CheckedFile) -> None:
    """Give a fresh ledger file ``FILE_MODE`` (never looser than the umask made it) and
    group ``LEDGER_GROUP`` where that group exists, on the daemon's descriptor."""
    path, descriptor = checked.opened[0]
    try:
        os.fchmod(descriptor, stat.S_IMODE(os.fstat(descriptor).st_mode) & FILE_MODE)
    except OSError as error:
        log.warning("run ledger %s: cannot set mode %o: %s", path, FILE_MODE,
                    error.strerror or error)
    try:
        gid = grp.getgrnam(LEDGER_GROUP).gr_gid
    except KeyError:
        return
    try:
        os.fchown(descriptor, -1, gid)
    except OSError as error:
        log.warning("run ledger %s: cannot give it group %s: %s", path, LEDGER_GROUP,
                    error.strerror or error)


def tighten(checked: CheckedFile) -> None:
    """Take ``LOOSE_BITS`` off an existing ledger file and its ``-wal``/``-shm``
    (one log line when it did), on the daemon's descriptors."""
    tightened = []
    for path, descriptor in checked.opened:
        try:
            mode = stat.S_IMODE(os.fstat(descriptor).st_mode)
            if mode & LOOSE_BITS:
                os.fchmod(descriptor, mode & ~LOOSE_BITS)
                tightened.append(f"{path.name} {mode:o} -> {mode & ~LOOSE_BITS:o}")
        except OSError as error:
            log.warning("run ledger %s: cannot tighten its mode: %s", path,
                        error.strerror or error)
    if tightened:
        log.warning("run ledger %s was readable or writable by other users; tightened: %s",
                    checked.path, ", ".join(tightened))


def migrate(connection: sqlite3.Connection, version: int) -> None:
    """Upgrade a file of schema ``version`` to ``SCHEMA_VERSION`` in one transaction."""

    def upgrade() -> None:
        current = connection.execute("PRAGMA user_version").fetchone()[0]
        for step in range(current, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                connection.execute(statement)
        connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    _immediate(connection, upgrade)


def backup_path(path: Path, version: int) -> Path:
    """Where the ledger at ``path`` is copied before it is upgraded from schema ``version``:
    ``<path>.schema-<version>.bak`` beside it."""
    return path.with_name(f"{path.name}.schema-{version}.bak")


def back_up(real: Path, path: Path, version: int) -> Path:
    """Copy the checked ledger file ``real`` (of schema ``version``; ``path`` as
    configured, for messages) to ``backup_path`` before its first write: SQLite's online
    backup of a read-only connection (the committed content of the file and its
    ``-wal``, as one file) into ``<backup>.partial`` (made with ``O_EXCL``, never
    through a symlink, mode ``BACKUP_MODE``), synced, then renamed over the backup and
    the folder synced, so a backup either is whole or is not there. ``LedgerError``
    (``disk_full`` when the disk has no room for it) leaves the ledger as it was and no
    partial file."""
    target = backup_path(real, version)
    partial = target.with_name(target.name + ".partial")
    try:
        partial.unlink(missing_ok=True)  # left by a daemon killed while it wrote one
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, BACKUP_MODE)
    except OSError as error:
        raise _os_error(f"cannot back up the ledger {path} before upgrading it", error) \
            from None
    try:
        source = _open(real, path, "ro")
        try:
            copy = sqlite3.connect(partial, isolation_level=None)
            try:
                source.backup(copy)
                copy.execute("PRAGMA journal_mode=DELETE")  # one file, as restored
            finally:
                copy.close()
        finally:
            source.close()
        os.fsync(descriptor)
        os.replace(partial, target)
        _sync_folder(target.parent)
    except sqlite3.Error as error:
        partial.unlink(missing_ok=True)
        raise LedgerError.of(f"cannot back up the ledger {path} before upgrading it",
                             error) from None
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise _os_error(f"cannot back up the ledger {path} before upgrading it", error) \
            from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        os.close(descriptor)
    log.info("run ledger %s: schema %d backed up to %s before the upgrade", path, version,
             target)
    return target


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _os_error(what: str, error: OSError) -> LedgerError:
    """``what`` failed with ``error``, its ``LedgerError.reason`` from its errno (as
    ``trainmon.ledger.files`` reads them: ``ENOSPC`` ``disk_full``, ``EROFS``
    ``read_only``, ``EIO`` ``io_error``)."""
    unusable = cannot_use(what, error)
    return LedgerError(str(unusable), unusable.reason)


def _immediate(connection: sqlite3.Connection, work: Callable[[], None]) -> None:
    """Run ``work`` in one ``BEGIN IMMEDIATE`` transaction; roll back what SQLite
    has not already rolled back itself when it fails."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        work()
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def _open(real: Path, path: Path, mode: str) -> sqlite3.Connection:
    """A connection to the checked file ``real`` (``path`` as configured, for messages)."""
    uri = f"{real.as_uri()}?mode={mode}"
    try:
        # One thread at a time, not always the same one: the recorder opens at
        # start and writes from its thread, under its own lock.
        connection = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                                     isolation_level=None, check_same_thread=False)
        connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    except sqlite3.Error as error:
        raise LedgerError.of(f"cannot open the ledger {path}", error) from None
    return connection


def _verify(real: Path, path: Path, *, integrity: bool) -> int:
    """Format, application id, schema version and (``integrity``) ``quick_check``, on a
    read-only connection to the checked file ``real``; the schema version."""
    connection = _open(real, path, "ro")
    try:
        try:
            application_id = connection.execute("PRAGMA application_id").fetchone()[0]
        except sqlite3.DatabaseError as error:
            if error_name(error) == "SQLITE_NOTADB":
                raise LedgerError(
                    f"{path} is not an SQLite database (not a trainmon ledger); left "
                    "untouched: move it away or set collectors.ledger.path") from None
            raise
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if application_id != APPLICATION_ID:
            raise LedgerError(
                f"{path} is an SQLite database of another program (application_id "
                f"{application_id:#x}, a trainmon ledger has {APPLICATION_ID:#x}); left "
                "untouched: move it away or set collectors.ledger.path")
        if version < 1:
            raise LedgerError(
                f"{path} carries the trainmon application_id but no ledger schema "
                f"version (user_version {version}); left untouched: move it away")
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"{path} has ledger schema {version}, newer than this trainmon's "
                f"{SCHEMA_VERSION}; left untouched: upgrade trainmon")
        problems = [row[0] for row in connection.execute("PRAGMA quick_check(5)")] \
            if integrity else ["ok"]
        if problems != ["ok"]:
            raise LedgerError(f"{path} is corrupt ({'; '.join(problems)}); left untouched",
                              "corrupt")
    except sqlite3.DatabaseError as error:
        raise LedgerError.of(f"{path} is not a readable trainmon ledger", error) from None
    finally:
        connection.close()
    return int(version)


def _create(connection: sqlite3.Connection) -> None:
    def create() -> None:
        for statement in TABLES:
            connection.execute(statement)
        connection.execute(f"PRAGMA application_id={APPLICATION_ID}")
        connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    _immediate(connection, create)
