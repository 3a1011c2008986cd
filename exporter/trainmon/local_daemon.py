"""Where this node's daemon answers, for the commands that read it (``doctor``,
``runs``, ``compare``) when no ``--url`` names one.

The address is the one the daemon would use: ``$TRAINMON_LISTEN`` when set (as
``trainmon serve`` reads it), else ``listen`` of the configuration file the
commands were given (``--config`` / ``$TRAINMON_CONFIG``, the file the daemon
reads), else the default ``:19400``; a wildcard host (``0.0.0.0``, ``::``) is
asked on loopback. Its step socket is ``collectors.training.socket`` of that
configuration, or the system socket ``/run/trainmon/steps.sock`` (a root
daemon's, as a user's client finds it: ``trainmon.paths``), whichever a daemon
has bound. Plain HTTP: a daemon behind TLS or basic auth (a web config) is read
with ``--url`` (``doctor``) or its ledger file.

**Whom the commands read.** While no daemon runs, any user may listen on its
port and answer in its place. Before a command reads a daemon on this node
(a URL whose host is a loopback address or an address of this host, given or
found), ``TrustedDaemon.check`` asks the kernel who owns the listening socket
(``trainmon.http.peer.listener_owner``) and refuses (``UntrustedDaemon``, exit
2) unless it is a trusted owner (``DaemonTrust``): root; the service user
``trainmon`` (the systemd unit's ``User=``); the owner of the system folders
``/var/lib/trainmon`` and ``/run/trainmon``, which only root can make and hand
over (the unit's ``StateDirectory=``, the DaemonSet's uid 19400); the caller
itself; and whoever ``--trust-daemon-owner`` names. ``TrustedDaemon.describe``
is the line the commands print (which pid and uid were read), and
``TrustedDaemon.confirm`` checks, after the last read, that the same socket
still listens. A remote host is read as given: whose process answers there is
not checked (its TLS and basic auth are the way to trust it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import socket
import stat
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import requests

from trainmon.http.listen import DEFAULT_LISTEN, ListenAddress, parse_listen_address
from trainmon.http.peer import ListenerOwner, ip_address_of, listener_owner
from trainmon.paths import (
    SYSTEM_RUNTIME_DIRECTORY,
    SYSTEM_SOCKET_PATH,
    SYSTEM_STATE_DIRECTORY,
    socket_listening,
)

#: Seconds the probe of ``answers`` waits for the daemon.
PROBE_TIMEOUT_SECONDS = 2.0
#: Hosts that mean "every interface": asked on loopback.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
#: The account the systemd unit runs the daemon as (deploy/systemd/trainmon.service).
SERVICE_USER = "trainmon"
#: Folders only root can make; whoever root handed them to runs the daemon.
SYSTEM_FOLDERS = (SYSTEM_STATE_DIRECTORY, SYSTEM_RUNTIME_DIRECTORY)
#: ``--trust-daemon-owner any``: read whoever listens, unchecked.
ANY_OWNER = "any"
#: The flag that names a further trusted owner, as the refusal quotes it.
TRUST_FLAG = "--trust-daemon-owner"

#: ``listener_owner``'s signature: who listens on (address, port) of this node.
ListenerLookup = Callable[[str, int], ListenerOwner | None]


@dataclass(frozen=True)
class LocalDaemon:
    """The node daemon as this process expects to find it."""

    #: ``http://127.0.0.1:19400``; None when the port is 0 (chosen at start: unknown).
    url: str | None
    #: Where the address came from, in words (``listen of /etc/trainmon/trainmon.yml``).
    origin: str
    #: The step socket a running daemon holds, if any.
    socket: Path | None

    @classmethod
    def of(cls, listen: ListenAddress, step_socket: Path | None, config_path: Path | None,
           environ: Mapping[str, str]) -> LocalDaemon:
        """From the configuration the command loaded (its ``listen`` and
        ``collectors.training.socket``, read from ``config_path``) and the environment."""
        configured = listen
        listen_text = environ.get("TRAINMON_LISTEN", "")
        if listen_text:
            try:
                listen = parse_listen_address(listen_text)
                origin = f"TRAINMON_LISTEN={listen_text}"
            except ValueError:
                listen, origin = configured, f"listen {configured}"
        elif config_path is not None:
            origin = f"listen {configured} of {config_path}"
        else:
            listen = parse_listen_address(DEFAULT_LISTEN)
            origin = f"the default listen address :{listen.port}"
        candidates = [step_socket, SYSTEM_SOCKET_PATH]
        held = next((path for path in candidates
                     if path is not None and socket_listening(path)), None)
        return cls(url=loopback_url(listen), origin=origin, socket=held)


def loopback_url(listen: ListenAddress) -> str | None:
    """The URL that reaches a daemon listening on ``listen`` from this node."""
    if listen.port == 0:
        return None
    host = _WILDCARDS.get(listen.host, listen.host)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{listen.port}"


def answers(url: str, session: requests.Session | None = None,
            timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether an HTTP server answers ``url``/healthz at all (any status)."""
    get = session.get if session is not None else requests.get
    try:
        get(f"{url}/healthz", timeout=timeout).close()
    except requests.RequestException:
        return False
    return True


class UntrustedDaemon(Exception):
    """The process listening for the daemon is not a trusted owner's (exit 2)."""


@dataclass(frozen=True)
class DaemonTrust:
    """The owners of a local daemon's listening socket that a command reads."""

    #: Trusted uids.
    uids: frozenset[int]
    #: ``--trust-daemon-owner any``: every owner, and a listener nobody can name.
    anyone: bool = False

    @classmethod
    def default(cls, named: Iterable[str] = (), *, euid: int | None = None,
                folders: Iterable[Path] = SYSTEM_FOLDERS) -> DaemonTrust:
        """Root, the service user, the owner of the system folders, the caller
        (``euid``), and the owners ``named`` (uids or user names, or ``any``);
        ``ValueError`` for a name the user database does not know."""
        uids = {0, os.geteuid() if euid is None else euid}
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(SERVICE_USER).pw_uid)
        uids.update(owner for owner in map(_handed_to, folders) if owner is not None)
        anyone = False
        for name in named:
            name = name.strip()
            if name == ANY_OWNER:
                anyone = True
            elif name.isdigit():
                uids.add(int(name))
            elif name:
                try:
                    uids.add(pwd.getpwnam(name).pw_uid)
                except KeyError:
                    raise ValueError(f"{TRUST_FLAG}: no user {name!r} on this host") from None
        return cls(frozenset(uids), anyone)

    def trusts(self, uid: int) -> bool:
        return self.anyone or uid in self.uids


@dataclass(frozen=True)
class TrustedDaemon:
    """A daemon URL whose listener on this node has a trusted owner."""

    url: str
    #: The listening sockets a connection to the URL's host may reach on this node;
    #: empty when nothing listens there, or the host is remote (``local`` False).
    listeners: tuple[ListenerOwner, ...]
    #: Whether the host is this node (a loopback address or one of its own).
    local: bool
    trust: DaemonTrust

    @classmethod
    def check(cls, url: str, trust: DaemonTrust,
              lookup: ListenerLookup = listener_owner) -> TrustedDaemon:
        """``url`` checked: ``UntrustedDaemon`` when a local listener has an owner
        ``trust`` does not trust, or the kernel cannot name it."""
        host, port = _host_port(url)
        addresses = [address for address in _addresses(host, port) if is_local_address(address)]
        listeners: dict[int, ListenerOwner] = {}
        for address in addresses:
            try:
                owner = lookup(address, port)
            except OSError as error:
                if trust.anyone:
                    continue
                raise UntrustedDaemon(
                    f"refusing to read {url}: the kernel's socket table (sock_diag) cannot "
                    f"say who listens on port {port} ({error}); give {TRUST_FLAG} "
                    f"{ANY_OWNER} to read it unchecked") from None
            if owner is not None:
                listeners.setdefault(owner.inode, owner)
        for owner in listeners.values():
            if not trust.trusts(owner.uid):
                raise UntrustedDaemon(
                    f"refusing to read {url}: it is served by {owner}, not by root or "
                    "the daemon's service user (trainmon, or the owner of "
                    f"{' and '.join(map(str, SYSTEM_FOLDERS))}): any user may listen on "
                    f"a free port while no daemon runs. Stop that process, or give "
                    f"{TRUST_FLAG} {owner.uid} if you trust it")
        return cls(url, tuple(listeners.values()), bool(addresses), trust)

    def describe(self) -> str:
        """``the daemon at URL (pid 123 trainmon, uid 0 root)``: what was read."""
        if not self.local:
            return f"the daemon at {self.url} (a remote host: its process is not checked)"
        if not self.listeners:
            return f"the daemon at {self.url} (nothing listens there on this node)"
        return f"the daemon at {self.url} ({'; '.join(map(str, self.listeners))})"

    def confirm(self, lookup: ListenerLookup = listener_owner) -> None:
        """After the reads: ``UntrustedDaemon`` unless the same sockets still listen
        (another process took the port while the command read it)."""
        now = TrustedDaemon.check(self.url, self.trust, lookup)
        if {owner.inode for owner in now.listeners} - {o.inode for o in self.listeners}:
            raise UntrustedDaemon(
                f"refusing what {self.url} answered: another socket listens there now "
                f"({'; '.join(map(str, now.listeners))}) than when it was checked "
                f"({'; '.join(map(str, self.listeners)) or 'none'}); run the command again")


def trusted_local_daemon(url: str, trust: DaemonTrust | None = None) -> TrustedDaemon:
    """``TrustedDaemon.check`` with the default trust (``DaemonTrust.default()``)."""
    return TrustedDaemon.check(url, DaemonTrust.default() if trust is None else trust)


def is_local_address(address: str) -> bool:
    """Whether a connection to ``address`` stays on this node: a loopback or wildcard
    address, or one the kernel routes to this node itself (as the source address it
    would pick for it)."""
    try:
        parsed = ip_address_of(address)
    except ValueError:
        return False
    if parsed.is_loopback or parsed.is_unspecified:
        return True
    family = socket.AF_INET if parsed.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((str(parsed), 9))  # a datagram socket's connect sends nothing
            return bool(ipaddress.ip_address(probe.getsockname()[0].split("%")[0]) == parsed)
    except OSError:
        return False


def _host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.hostname or "", port or (443 if parts.scheme == "https" else 80)


def _addresses(host: str, port: int) -> list[str]:
    """The addresses a client would try for ``host``, in order; none when it does not
    resolve (then nothing is read either)."""
    try:
        return [str(ip_address_of(host))]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(entry[4][0]) for entry in found))


def _handed_to(folder: Path) -> int | None:
    """The owner of a system folder (a real directory in a folder only root may write),
    when not root: the user root handed it to, who runs the daemon."""
    try:
        found = os.lstat(folder)
        parent = os.stat(folder.parent)
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode) or parent.st_uid != 0 or parent.st_mode & 0o022:
        return None
    return found.st_uid if found.st_uid != 0 else None
