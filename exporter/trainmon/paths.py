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
A folder inside a directory where anyone may create names (``/tmp``) must be a
real directory owned by the daemon's user and writable by nobody else, made
or found: otherwise another user may have made it first, to receive the
reports or to replace the file, and it is refused (``PermissionError``).

The client (``client_socket_path``) sends where a daemon of the same user
listens, else to the system socket: the socket a daemon started by this user
would bind, when a daemon answers a ``connect()`` there (and its folder passes
the ``/tmp`` rule above); otherwise ``/run/trainmon/steps.sock``. So a
per-user daemon gets its user's reports, and on a node where root runs the
daemon every user reports to it. ``TRAINMON_ENDPOINT`` overrides all of this.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import socket
import stat
from collections.abc import Mapping
from pathlib import Path

SYSTEM_STATE_DIRECTORY = Path("/var/lib/trainmon")
SYSTEM_RUNTIME_DIRECTORY = Path("/run/trainmon")
#: Where ``/tmp/trainmon-<uid>`` goes when ``XDG_RUNTIME_DIR`` is unset.
TEMPORARY_DIRECTORY = Path("/tmp")
LEDGER_NAME = "ledger.sqlite3"
SOCKET_NAME = "steps.sock"
SYSTEM_LEDGER_PATH = SYSTEM_STATE_DIRECTORY / LEDGER_NAME
SYSTEM_SOCKET_PATH = SYSTEM_RUNTIME_DIRECTORY / SOCKET_NAME
#: Modes of the folders root makes (state: group members read the ledger;
#: runtime: the socket's mode decides who sends); any other user's are private.
STATE_DIRECTORY_MODE = 0o750
RUNTIME_DIRECTORY_MODE = 0o755
PRIVATE_DIRECTORY_MODE = 0o700
#: The group of the state folder root makes, where it exists (the ledger's group).
STATE_GROUP = "trainmon"


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
            check_folder_owner(own.parent, euid)
        except OSError:
            return system / SOCKET_NAME
        return own
    return system / SOCKET_NAME


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
    above it ``0755`` (root) or ``0700`` (others), and leaves existing ones alone."""
    above = RUNTIME_DIRECTORY_MODE if euid == 0 else PRIVATE_DIRECTORY_MODE
    missing: list[Path] = []
    current = path
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    made: list[Path] = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode if folder == path else above)  # the umask may take bits off
        except FileExistsError:  # made meanwhile by someone else: checked below
            continue
        made.append(folder)
        if folder == path and gid is not None:
            os.chown(folder, -1, gid)
    check_folder_owner(path, euid)
    return made


def check_folder_owner(path: Path, euid: int | None = None) -> None:
    """Refuse (``PermissionError``) a folder in a world-writable directory that is not a
    directory of ``euid``'s, or that others may write; anywhere else, accept it."""
    euid = _euid(euid)
    parent = os.stat(path.parent)
    if not parent.st_mode & stat.S_IWOTH:
        return
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode):
        raise PermissionError(errno.EPERM, f"{path} is not a directory; refusing it "
                              f"(anyone may create names in {path.parent})")
    if found.st_uid != euid:
        raise PermissionError(errno.EPERM, f"{path} belongs to uid {found.st_uid}, not "
                              f"to uid {euid}; refusing it (anyone may create folders in "
                              f"{path.parent}): remove it or set the path in the config")
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(errno.EPERM, f"{path} is writable by other users (mode "
                              f"{stat.S_IMODE(found.st_mode):04o}); refusing it")
