"""The ledger's files on disk: where they may be, who may own them, their modes, and
the descriptors the daemon keeps of them.

SQLite opens the database, its ``-wal`` and its ``-shm`` by name, following
symlinks, and Python's ``sqlite3`` cannot pass it ``SQLITE_OPEN_NOFOLLOW``
or a descriptor. Nor does ``/proc/self/fd/N`` help: SQLite resolves the
symlinks of the name it is given (``unixFullPathname``), so it would open
the file by its current name again, and it names the ``-wal``/``-shm`` after
that name. So the file is made safe to open by name, and then checked to be
the one opened:

1. **The folder** (``trainmon.paths.check_folder``): every component from
   ``/`` down belongs to a trusted owner and is writable by no one else.
   Only those owners can then rename, replace or add names in it: what is
   checked below stays what SQLite opens. The folder's symlinks are
   resolved; SQLite gets the resolved path.
2. **The file**, opened by the daemon itself with ``O_NOFOLLOW`` (a symlink
   is refused, ``ELOOP``) and ``O_NONBLOCK`` (a FIFO planted there cannot
   hang it), created with ``O_CREAT|O_EXCL`` when missing, and checked on the
   descriptor (``fstat``): a regular file, one link (a hard link to another
   file would have it written through), owned by a trusted owner; a ledger
   of another user is refused, never adopted. The ``-wal``/``-shm``, when
   they exist, are checked alike. ``trainmon.ledger.schema`` sets modes and
   group on these descriptors (``fchmod``/``fchown``), never by path.
3. **After SQLite opened it**, the path must still name the same inode
   (``st_dev``/``st_ino``) as the checked descriptor.

Readers (``Ledger.open(readonly=True)``: ``trainmon runs``, ``GET
/api/v1/runs``) do 1 and 3 and check the file with ``lstat``, which the
safe folder makes as good as a descriptor; they open nothing themselves and
change nothing.

The descriptors are kept, not closed after the check: closing any
descriptor of a file drops every POSIX advisory lock the process holds on
it (fcntl semantics), SQLite's included, and an outside reader would then
believe itself the last connection and delete the ``-wal``/``-shm`` under the
running daemon. They are held per file (``FileKey``) while any ``Ledger`` of
this process has that file open (the recorder's, and the read-only ones of
``GET /api/v1/runs`` that come and go beside it) and closed only when the
last one closes, when SQLite holds no lock on it any more.

**One writer** (``lock_writer``): the daemon's recorder holds an exclusive
``flock`` on ``<ledger>.lock`` beside the file for as long as it records into it,
so two daemons on one node (two root daemons left with the default path, an
upgrade that starts the new daemon before the old one stopped) never both
write the ledger. A sibling file, not the database itself: on NFS, Linux
emulates ``flock`` with POSIX locks, which would collide with SQLite's own.
The lock file is made and checked as the database is (no symlink, a regular
file of one link owned by a trusted owner, ``O_CLOEXEC``: no child inherits
it) and says who holds it (pid, host, since when), which the refused daemon
names. The kernel drops the lock when its holder exits, however it exits, so
a ``kill -9``'d daemon leaves nothing to clean up. Readers never take it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.paths import check_folder

#: Files SQLite keeps beside the database in WAL mode.
SIDE_SUFFIXES = ("-wal", "-shm")
#: The file beside the database whose ``flock`` the recording daemon holds.
LOCK_SUFFIX = ".lock"
#: The most of a lock file's holder line that is read back.
MAX_HOLDER_BYTES = 512
#: How the daemon opens a ledger file to check it: never through a symlink, never
#: waiting on a FIFO, never inherited by a child.
_CHECK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

#: (``st_dev``, ``st_ino``) of a database file.
FileKey = tuple[int, int]


class UnsafeLedgerFile(Exception):
    """The ledger's path or file may not be used (a message that names the reason);
    ``reason`` as ``LedgerError.reason``."""

    def __init__(self, message: str, reason: str = "other") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class CheckedFile:
    """A ledger file that passed the checks: the path SQLite is to open, its identity,
    and (writable) the descriptors of it and its ``-wal``/``-shm``."""

    #: The resolved folder and the file's name: what SQLite opens.
    path: Path
    key: FileKey
    #: Missing or empty before: the schema is to be created.
    fresh: bool
    #: (path, descriptor) of the database, then of each ``-wal``/``-shm`` there
    #: (writable only).
    opened: list[tuple[Path, int]] = field(default_factory=list)


def check_writable(path: Path, owners: Collection[int], create_mode: int) -> CheckedFile:
    """Check ``path``'s folder, open (create when missing, ``create_mode`` less the
    umask) the file and its ``-wal``/``-shm`` as the module says; the descriptors are
    held (``release``).
    ``UnsafeLedgerFile`` when it may not be used; nothing is changed then (a file
    just created stays, empty)."""
    real = _folder(path, owners) / path.name
    before: os.stat_result | None = None
    try:
        descriptor = os.open(real, _CHECK_FLAGS | os.O_CREAT | os.O_EXCL, create_mode)
    except FileExistsError:
        before, descriptor = _open_existing(real, path)
    except OSError as error:
        raise _cannot(f"cannot create the ledger {path}", error) from None
    found = os.fstat(descriptor)
    checked = CheckedFile(real, (found.st_dev, found.st_ino), fresh=found.st_size == 0,
                          opened=[(real, descriptor)])
    _hold(checked)  # from here on, release() closes every descriptor opened
    try:
        _same(path, before, found, owners)
        for side in _side_files(real):
            try:
                before, descriptor = _open_existing(side, side)
            except FileNotFoundError:
                continue
            _add(checked, side, descriptor)
            _same(side, before, os.fstat(descriptor), owners)
    except BaseException:
        release(checked)
        raise
    return checked


def check_readable(path: Path, owners: Collection[int]) -> CheckedFile:
    """Check ``path``'s folder, the file and its ``-wal``/``-shm`` with ``lstat``
    (readers open no descriptor of their own); held like a writable one (``release``).
    ``UnsafeLedgerFile`` when it may not be read."""
    real = _folder(path, owners) / path.name
    try:
        found = os.lstat(real)
    except FileNotFoundError:
        raise UnsafeLedgerFile(f"no ledger at {path}") from None
    except OSError as error:
        raise _cannot(f"cannot read the ledger {path}", error) from None
    _regular(path, found)
    _trusted(path, found, owners)
    for side in _side_files(real):
        try:
            beside = os.lstat(side)
        except FileNotFoundError:
            continue
        except OSError as error:
            raise _cannot(f"cannot read the ledger {path}", error) from None
        _regular(side, beside)
        _trusted(side, beside, owners)
    checked = CheckedFile(real, (found.st_dev, found.st_ino), fresh=found.st_size == 0)
    _hold(checked)
    return checked


def confirm(checked: CheckedFile, path: Path) -> None:
    """After SQLite opened ``checked.path``: ``UnsafeLedgerFile`` unless that name
    still is the checked file."""
    try:
        found = os.lstat(checked.path)
    except OSError as error:
        raise _cannot(f"the ledger {path} went away while it was opened", error) from None
    if not stat.S_ISREG(found.st_mode) or (found.st_dev, found.st_ino) != checked.key:
        raise UnsafeLedgerFile(f"refusing the ledger {path}: it was replaced while it was "
                               "opened")


# -- descriptors held while the file is open -------------------------------------------


@dataclass
class _Held:
    users: int
    descriptors: list[int]


_held: dict[FileKey, _Held] = {}
_held_lock = threading.Lock()


def _hold(checked: CheckedFile) -> None:
    with _held_lock:
        held = _held.setdefault(checked.key, _Held(0, []))
        held.users += 1
        held.descriptors.extend(descriptor for _, descriptor in checked.opened)


def _add(checked: CheckedFile, path: Path, descriptor: int) -> None:
    """One more descriptor of ``checked``'s file (its ``-wal``/``-shm``), held with it."""
    checked.opened.append((path, descriptor))
    with _held_lock:
        _held[checked.key].descriptors.append(descriptor)


def release(checked: CheckedFile) -> None:
    """The ``Ledger`` of ``checked`` closed (or never opened): close the file's held
    descriptors once no ledger of this process has it open."""
    with _held_lock:
        held = _held.get(checked.key)
        if held is None:
            return
        held.users -= 1
        if held.users > 0:
            return
        del _held[checked.key]
    for descriptor in held.descriptors:
        os.close(descriptor)


def held_descriptors() -> int:
    """Descriptors held now, over every ledger file (for tests and ``/healthz``)."""
    with _held_lock:
        return sum(len(held.descriptors) for held in _held.values())


# -- checks ---------------------------------------------------------------------------


def _folder(path: Path, owners: Collection[int]) -> Path:
    try:
        return check_folder(Path(os.getcwd(), path).parent, owners=owners)
    except FileNotFoundError:
        raise UnsafeLedgerFile(f"no ledger at {path}: directory {path.parent} does not "
                               "exist") from None
    except PermissionError as error:  # UnsafePathError names the component
        raise UnsafeLedgerFile(str(error.strerror or error)) from None
    except OSError as error:
        raise _cannot(f"cannot use the folder of {path}", error) from None


def _open_existing(real: Path, shown: Path) -> tuple[os.stat_result, int]:
    """``lstat`` and a descriptor of the existing file ``real``, never of a symlink,
    FIFO or device; ``FileNotFoundError`` when it is missing."""
    before = os.lstat(real)
    _regular(shown, before)  # checked before opening: opening a device may do something
    try:
        return before, os.open(real, _CHECK_FLAGS)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeLedgerFile(f"refusing the ledger {shown}: it is a symlink") from None
        raise _cannot(f"cannot open the ledger {shown}", error) from None


def _same(shown: Path, before: os.stat_result | None, found: os.stat_result,
          owners: Collection[int]) -> None:
    """The descriptor's file (``found``) is the regular file ``lstat`` saw (``before``;
    None: just created) and its owner is trusted."""
    _regular(shown, found)
    if before is not None and (found.st_dev, found.st_ino) != (before.st_dev, before.st_ino):
        raise UnsafeLedgerFile(f"refusing the ledger {shown}: it was replaced while it was "
                               "opened")
    _trusted(shown, found, owners)


def _regular(shown: Path, found: os.stat_result) -> None:
    if stat.S_ISLNK(found.st_mode):
        raise UnsafeLedgerFile(f"refusing the ledger {shown}: it is a symlink (the daemon "
                               "never writes through one)")
    if not stat.S_ISREG(found.st_mode):
        raise UnsafeLedgerFile(f"{shown} is not a regular file")


def _trusted(shown: Path, found: os.stat_result, owners: Collection[int]) -> None:
    if found.st_uid not in owners:
        raise UnsafeLedgerFile(
            f"refusing the ledger {shown}: it belongs to uid {found.st_uid} (mode "
            f"{stat.S_IMODE(found.st_mode):04o}), not to root or the daemon's user; "
            "move it away (the daemon makes a new one)")
    if found.st_nlink != 1:
        raise UnsafeLedgerFile(
            f"refusing the ledger {shown}: it has {found.st_nlink} hard links (another "
            "name for the same file could be written through it)")


# -- one writer ----------------------------------------------------------------------


class LedgerLocked(UnsafeLedgerFile):
    """Another process holds the ledger's writer lock; ``holder`` is what it wrote of
    itself (``""`` when that could not be read)."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message, "locked")
        self.holder = holder


@dataclass
class WriterLock:
    """The exclusive lock on a ledger's ``<name>.lock`` (``lock_writer``)."""

    path: Path
    descriptor: int

    def release(self) -> None:
        """Drop the lock (close its descriptor); safe to call twice."""
        if self.descriptor >= 0:
            os.close(self.descriptor)
            self.descriptor = -1


def lock_writer(path: Path, owners: Collection[int], create_mode: int) -> WriterLock:
    """Take the writer lock of the ledger at ``path`` (module docstring), without
    waiting, and write this process's holder line into it. ``LedgerLocked`` naming the
    holder when another process has it; ``UnsafeLedgerFile`` when the lock file may not
    be used (its folder, a symlink, another owner...), as for the database."""
    real = _folder(path, owners) / (path.name + LOCK_SUFFIX)
    shown = path.with_name(path.name + LOCK_SUFFIX)
    before: os.stat_result | None = None
    try:
        descriptor = os.open(real, _LOCK_FLAGS | os.O_CREAT | os.O_EXCL, create_mode)
    except FileExistsError:
        before = os.lstat(real)
        _regular(shown, before)
        try:
            descriptor = os.open(real, _LOCK_FLAGS)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise UnsafeLedgerFile(f"refusing the ledger lock {shown}: it is a symlink") \
                    from None
            raise _cannot(f"cannot open the ledger lock {shown}", error) from None
    except OSError as error:
        raise _cannot(f"cannot create the ledger lock {shown}", error) from None
    try:
        _same(shown, before, os.fstat(descriptor), owners)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(descriptor)
            raise LedgerLocked(
                f"the run ledger {path} is held by another trainmon daemon "
                f"({holder or 'its holder did not say who it is'}; lock {shown})",
                holder) from None
        _write_holder(descriptor)
    except BaseException:
        os.close(descriptor)
        raise
    return WriterLock(real, descriptor)


#: How a lock file is opened: read-write, never through a symlink, never waiting on a
#: FIFO, never inherited by a child.
_LOCK_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _write_holder(descriptor: int) -> None:
    """Say who holds the lock (pid, host, since when) in its file; a full disk costs the
    line, never the lock."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"pid {os.getpid()} on {socket.gethostname()} since "
                              f"{started}\n".encode(), 0)
    except OSError:
        pass


def _holder(descriptor: int) -> str:
    """The holder line of a lock file, printable characters only."""
    try:
        text = os.pread(descriptor, MAX_HOLDER_BYTES, 0).decode("utf-8", "replace")
    except OSError:
        return ""
    return "".join(char for char in text.strip() if char.isprintable())


def _side_files(real: Path) -> Sequence[Path]:
    return [real.with_name(real.name + suffix) for suffix in SIDE_SUFFIXES]


def _cannot(what: str, error: OSError) -> UnsafeLedgerFile:
    reason = {errno.ENOSPC: "disk_full", errno.EROFS: "read_only",
              errno.EIO: "io_error"}.get(error.errno or 0, "other")
    return UnsafeLedgerFile(f"{what}: {error.strerror or error}", reason)
