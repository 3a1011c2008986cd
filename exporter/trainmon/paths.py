"""Where the run ledger and the step socket are by default, and how their folders
are made. Standard library only: the training client imports it.

Two sets of defaults, chosen per file by who runs:

- **system**: ``/var/lib/trainmon/ledger.sqlite3`` and
  ``/run/trainmon/steps.sock``, for root and for a user who owns the system
  folder (the systemd unit's ``StateDirectory=``/``RuntimeDirectory=`` make
  them ``trainmon:trainmon``; the DaemonSet's init container hands them to uid
  19400);
- **per user** (XDG Base Directory) for anyone else: the ledger at
  ``$XDG_STATE_HOME/trainmon/ledger.sqlite3`` (``~/.local/state`` when unset),
  the socket at ``$XDG_RUNTIME_DIR/trainmon/steps.sock``, or, without
  ``XDG_RUNTIME_DIR`` (a cron job, ``su`` without a login session),
  ``/tmp/trainmon-<uid>/steps.sock``. A relative XDG variable is ignored, as the
  specification says.

Under systemd, ``$STATE_DIRECTORY`` and ``$RUNTIME_DIRECTORY`` (what the unit's
``StateDirectory=``/``RuntimeDirectory=`` made; the first when several) win
over both sets, for whoever runs: a unit that names other folders gets them
without a configuration file.

Folders (``make_state_directory``, ``make_runtime_directory``): the daemon
creates the folder of its socket and of its default ledger when missing (a
configured ledger folder must exist: ``trainmon.ledger.recorder``), with the
missing folders above them, and never changes one that exists. Made by root:
the state folder ``0750``, group ``trainmon`` where that group exists (its
members read the ``0640`` ledger, docs/security.md), the runtime folder
``0755`` (the socket's own mode, ``collectors.training.socket_mode``, decides
who may send), the folders above them ``0755``; made by any other user: all
``0700``. Never looser than the umask.

Every folder the daemon uses, default or configured, made or found, is
checked from ``/`` down (``check_folder``), as OpenSSH checks the folders of
``authorized_keys`` (``safe_path``) and a ``ChrootDirectory``: each component
must be a directory owned by root or by the daemon's user (``trusted_owners``;
a reader of the ledger also trusts the service user, ``reader_owners``) and
writable by no one else: no group or other write bit, even for a group of one
(a home made ``0775`` under umask ``002`` is refused; ``chmod g-w`` it).
Only then can no other user rename a folder on the way (``mv run run.root;
mkdir run`` captures the reports sent to a socket below a user's folder) or
swap the file in it. One exception, for ``/tmp`` and the like: a *sticky*
directory that others may write, owned by root or the daemon's user, may be
passed through when the next component is a real directory (not a symlink)
owned by root or the daemon's user, since the sticky bit lets no one else
rename or remove that entry; the socket's or the ledger's own folder is never
such a directory. Symlinks on the way are followed as the kernel would, each
one checked where it lies and its target walked from its start (a symlink
in a folder only trusted owners may write can only be changed by them).
A component that fails is refused (``UnsafePathError``, a
``PermissionError``) with its path, owner and mode; missing folders are made
only below a folder that passed. Access control lists are not read: the
mode bits are the rule.

The client (``client_socket_path``) sends where a daemon of the same user
listens, else to the system socket: the socket a daemon started by this user
would bind, when a daemon answers a ``connect()`` there (and its folder passes
the check above); otherwise ``/run/trainmon/steps.sock``. So a
per-user daemon gets its user's reports, and on a node where root runs the
daemon every user reports to it. ``TRAINMON_ENDPOINT`` overrides all of this.
"""

from __future__ import annotations

import errno
import functools
import grp
import os
import pwd
import socket
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

SYSTEM_STATE_DIRECTORY = Path("/var/lib/trainmon")
SYSTEM_RUNTIME_DIRECTORY = Path("/run/trainmon")
#: Where ``/tmp/trainmon-<uid>`` goes when ``XDG_RUNTIME_DIR`` is unset.
TEMPORARY_DIRECTORY = Path("/tmp")
LEDGER_NAME = "ledger.sqlite3"
SOCKET_NAME = "steps.sock"
#: Beside the socket: the open profile requests its clients read (``trainmon.profiling``).
PROFILE_REQUESTS_NAME = "profile-requests.json"
SYSTEM_LEDGER_PATH = SYSTEM_STATE_DIRECTORY / LEDGER_NAME
SYSTEM_SOCKET_PATH = SYSTEM_RUNTIME_DIRECTORY / SOCKET_NAME
#: Modes of the folders root makes (state: group members read the ledger;
#: runtime: the socket's mode decides who sends); any other user's are private.
STATE_DIRECTORY_MODE = 0o750
RUNTIME_DIRECTORY_MODE = 0o755
PRIVATE_DIRECTORY_MODE = 0o700
#: The group of the state folder root makes, where it exists (the ledger's group).
STATE_GROUP = "trainmon"
#: The service user of the systemd unit (deploy/systemd): readers of the ledger
#: trust the folders and the file it owns, as they trust root's.
SERVICE_USER = "trainmon"
#: Symlinks followed while checking one path (the kernel's ``MAXSYMLINKS``).
MAX_SYMLINKS = 40
#: A folder with either bit lets users other than its owner rename its entries.
SHARED_WRITE_BITS = stat.S_IWGRP | stat.S_IWOTH


def _euid(euid: int | None) -> int:
    return os.geteuid() if euid is None else euid


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def uses_system_directory(system: Path, euid: int | None = None) -> bool:
    """True for root, and for the owner of ``system`` (the service user)."""
    euid = _euid(euid)
    if euid == 0:
        return True
    try:
        found = os.stat(system)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == euid


def _absolute(environ: Mapping[str, str], name: str) -> Path | None:
    """``$name`` when it is an absolute path; None when unset, empty or relative."""
    value = environ.get(name, "")
    return Path(value) if value.startswith("/") else None


def _systemd_directory(environ: Mapping[str, str], name: str) -> Path | None:
    """The first folder of systemd's ``$name`` (colon-separated, absolute), if set."""
    first = environ.get(name, "").split(":", 1)[0]
    return Path(first) if first.startswith("/") else None


def _home(environ: Mapping[str, str], euid: int) -> Path:
    home = _absolute(environ, "HOME")
    if home is not None:
        return home
    try:
        return Path(pwd.getpwuid(euid).pw_dir)
    except KeyError:  # a uid without a passwd entry (a container's random uid)
        return Path("/")


def default_ledger_path(
    environ: Mapping[str, str] | None = None, euid: int | None = None,
    system: Path = SYSTEM_STATE_DIRECTORY,
) -> Path:
    """The ledger of this user's daemon: under ``system`` or ``$XDG_STATE_HOME``."""
    euid, environ = _euid(euid), _environ(environ)
    unit = _systemd_directory(environ, "STATE_DIRECTORY")
    if unit is not None:
        return unit / LEDGER_NAME
    if uses_system_directory(system, euid):
        return system / LEDGER_NAME
    state = _absolute(environ, "XDG_STATE_HOME") or _home(environ, euid) / ".local" / "state"
    return state / "trainmon" / LEDGER_NAME


def default_socket_path(
    environ: Mapping[str, str] | None = None, euid: int | None = None,
    system: Path = SYSTEM_RUNTIME_DIRECTORY, temporary: Path = TEMPORARY_DIRECTORY,
) -> Path:
    """The socket this user's daemon binds: under ``system``, ``$XDG_RUNTIME_DIR``
    or ``temporary/trainmon-<uid>``."""
    euid, environ = _euid(euid), _environ(environ)
    unit = _systemd_directory(environ, "RUNTIME_DIRECTORY")
    if unit is not None:
        return unit / SOCKET_NAME
    if uses_system_directory(system, euid):
        return system / SOCKET_NAME
    runtime = _absolute(environ, "XDG_RUNTIME_DIR")
    if runtime is not None:
        return runtime / "trainmon" / SOCKET_NAME
    return temporary / f"trainmon-{euid}" / SOCKET_NAME


def client_socket_path(
    environ: Mapping[str, str] | None = None, euid: int | None = None,
    system: Path = SYSTEM_RUNTIME_DIRECTORY, temporary: Path = TEMPORARY_DIRECTORY,
) -> Path:
    """Where a client of this user sends by default: its own daemon's socket when a
    daemon listens there, else the system socket."""
    euid = _euid(euid)
    own = default_socket_path(environ, euid, system, temporary)
    if own.parent != system and socket_listening(own):
        try:
            check_folder(own.parent, euid)
        except OSError:
            return system / SOCKET_NAME
        return own
    return system / SOCKET_NAME


def profile_requests_path(socket_path: str | Path) -> Path:
    """The file of open profile requests that the daemon binding ``socket_path``
    writes and its clients read (``trainmon.profiling.requests``)."""
    return Path(socket_path).parent / PROFILE_REQUESTS_NAME


def socket_listening(path: Path) -> bool:
    """Whether a process has ``path`` bound as a unix datagram socket (``connect()``
    succeeds; a stale socket file refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def make_state_directory(
    path: Path, euid: int | None = None, group: str = STATE_GROUP,
) -> list[Path]:
    """Create the ledger's folder ``path`` (and missing parents) as the module says;
    the folders made, outermost first. ``OSError`` when it cannot."""
    euid = _euid(euid)
    if euid != 0:
        return _make(path, PRIVATE_DIRECTORY_MODE, None, euid)
    try:
        gid: int | None = grp.getgrnam(group).gr_gid
    except KeyError:
        gid = None
    return _make(path, STATE_DIRECTORY_MODE, gid, euid)


def make_runtime_directory(path: Path, euid: int | None = None) -> list[Path]:
    """Create the socket's folder ``path`` (and missing parents) as the module says;
    the folders made, outermost first. ``OSError`` when it cannot."""
    euid = _euid(euid)
    mode = RUNTIME_DIRECTORY_MODE if euid == 0 else PRIVATE_DIRECTORY_MODE
    return _make(path, mode, None, euid)


def _make(path: Path, mode: int, gid: int | None, euid: int) -> list[Path]:
    """``mkdir -p`` that gives ``path`` ``mode`` and group ``gid``, the missing folders
    above it ``0755`` (root) or ``0700`` (others), and leaves existing ones alone;
    nothing is made below a folder that fails ``check_folder``."""
    above = RUNTIME_DIRECTORY_MODE if euid == 0 else PRIVATE_DIRECTORY_MODE
    missing: list[Path] = []
    current = Path(os.getcwd(), path)
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    if missing:  # the folder they go in: a sticky /tmp is fine, we make the next one
        _walk(current, trusted_owners(euid), sticky_last=True)
    made: list[Path] = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode if folder == missing[0] else above)  # the umask may take bits off
        except FileExistsError:  # made meanwhile by someone else: checked below
            continue
        made.append(folder)
        if folder == missing[0] and gid is not None:
            os.chown(folder, -1, gid)
    check_folder(path, euid)
    return made


class UnsafePathError(PermissionError):
    """A folder on the way to a path that another user could change (``check_folder``).

    ``component``: the folder (or entry) that failed; ``target``: the path asked for.
    """

    def __init__(self, target: Path, component: Path, problem: str) -> None:
        super().__init__(
            errno.EPERM,
            f"refusing {target}: {problem}; every folder from / down to it must belong "
            "to root or the daemon's user and be writable by no one else "
            "(docs/security.md, \"Configured paths\")")
        self.target = target
        self.component = component


def trusted_owners(euid: int | None = None) -> frozenset[int]:
    """The uids whose folders and files the daemon of ``euid`` trusts: root and itself."""
    return frozenset({0, _euid(euid)})


def reader_owners(euid: int | None = None) -> frozenset[int]:
    """``trusted_owners`` of a reader of the ledger: also the service user
    (``SERVICE_USER``) where it exists, whose daemon writes ``/var/lib/trainmon``."""
    service = _service_uid()
    return trusted_owners(euid) | (frozenset() if service is None else {service})


@functools.lru_cache(maxsize=1)
def _service_uid() -> int | None:
    """The service user's uid, looked up once (``GET /api/v1/runs`` opens the ledger
    on every request, and a passwd lookup may ask a directory server)."""
    try:
        return pwd.getpwnam(SERVICE_USER).pw_uid
    except KeyError:
        return None


def check_folder(
    path: Path, euid: int | None = None, *, owners: Collection[int] | None = None,
) -> Path:
    """The folder ``path`` with its symlinks resolved, once every component from ``/``
    down has passed the module's rule for ``owners`` (default: root and ``euid``).

    ``UnsafePathError`` names the component that fails, its owner and mode;
    ``FileNotFoundError`` for a missing one, ``NotADirectoryError`` for a file on the
    way, ``OSError(ELOOP)`` past ``MAX_SYMLINKS``.
    """
    return _walk(Path(path), frozenset(trusted_owners(euid) if owners is None else owners),
                 sticky_last=False)


def _walk(target: Path, owners: frozenset[int], sticky_last: bool) -> Path:
    """``check_folder``; ``sticky_last``: the last folder may be a sticky one others
    write (the caller makes the next component itself and checks it after)."""
    remaining = list(reversed(Path(os.getcwd(), target).parts[1:]))  # a stack of names
    current = Path("/")
    found = os.lstat(current)
    _owned(target, current, found, owners)
    links = 0
    while remaining:
        name = remaining.pop()
        if name in ("", "."):
            continue
        if name == "..":  # current has no symlink in it: its parent was walked already
            current = current.parent
            found = os.lstat(current)
            continue
        child = current / name
        below = os.lstat(child)
        if found.st_mode & SHARED_WRITE_BITS:
            _through_shared(target, current, found, child, below, owners)
        if stat.S_ISLNK(below.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, f"too many symlinks on the way to {target}")
            link = Path(os.readlink(child))
            if link.is_absolute():
                current, found = Path("/"), os.lstat("/")
            remaining.extend(reversed(link.parts[1:] if link.is_absolute() else link.parts))
            continue
        if not stat.S_ISDIR(below.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, f"{child} is not a directory (on the "
                                     f"way to {target})")
        _owned(target, child, below, owners)
        current, found = child, below
    shared = found.st_mode & SHARED_WRITE_BITS
    if shared and not (sticky_last and found.st_mode & stat.S_ISVTX):
        raise UnsafePathError(target, current, f"{current} is writable by other users "
                              f"({_owner_and_mode(found)})")
    return current


def _owned(target: Path, component: Path, found: os.stat_result,
           owners: frozenset[int]) -> None:
    if found.st_uid not in owners:
        raise UnsafePathError(target, component, f"{component} belongs to uid "
                              f"{found.st_uid} ({_owner_and_mode(found)})")


def _through_shared(target: Path, folder: Path, found: os.stat_result, child: Path,
                    below: os.stat_result, owners: frozenset[int]) -> None:
    """Going from ``folder``, which others may write, to ``child``: only through a
    sticky folder of a trusted owner, to a real directory of a trusted owner."""
    if not found.st_mode & stat.S_ISVTX or found.st_uid not in owners:
        raise UnsafePathError(target, folder, f"{folder} is writable by other users "
                              f"({_owner_and_mode(found)})")
    where = f"anyone may create names in {folder}: remove it or set the path in the config"
    if not stat.S_ISDIR(below.st_mode):
        raise UnsafePathError(target, child, f"{child} is not a directory; {where}")
    if below.st_uid not in owners:
        raise UnsafePathError(target, child, f"{child} belongs to uid {below.st_uid} "
                              f"({_owner_and_mode(below)}); {where}")


def _owner_and_mode(found: os.stat_result) -> str:
    """``owner mallory, mode 0755`` (the uid alone when it has no passwd entry)."""
    try:
        name = pwd.getpwuid(found.st_uid).pw_name
    except KeyError:
        name = "no passwd entry"
    return f"owner {name}, mode {stat.S_IMODE(found.st_mode):04o}"
