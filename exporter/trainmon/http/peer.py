"""Who is on the other end of a loopback TCP connection: the kernel's answer.

A client on ``127.0.0.1`` may be any local user. For a connection between two
sockets of this host the kernel knows the user that owns the client's socket;
``loopback_peer_uid`` asks it through the ``sock_diag`` netlink interface
(``NETLINK_SOCK_DIAG``, what ``ss -e`` uses): one exact lookup of the client's
socket by its four-tuple, answered with ``inet_diag_msg.idiag_uid``. No file
is read and the cost does not grow with the number of sockets on the node.
The uid is the one the kernel recorded when the client created its socket,
as the process's user namespace maps it into the daemon's.

Linux only; any failure (no ``inet_diag`` support, the socket already gone,
an address that is not loopback) answers None, and the caller refuses the
request rather than guessing.

The other direction, for the commands that read a daemon (``doctor``,
``runs``): ``listener_owner(host, port)`` names who listens on a port of this
host, the socket a connection to ``host:port`` would reach, found by the
kernel's own lookup (the same netlink request, for the listening socket:
``idiag_uid`` and its inode), and the process holding it (the first pid
whose ``/proc/<pid>/fd`` links to that inode: all of them for root, a user's
own otherwise; None when not found).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from trainmon.terminal import one_line

#: ``NETLINK_SOCK_DIAG`` and its request type ``SOCK_DIAG_BY_FAMILY`` (linux/sock_diag.h).
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
#: Every TCP state (a bit per state).
ALL_STATES = 0xFFFFFFFF
#: ``TCP_LISTEN`` (include/net/tcp_states.h).
TCP_LISTEN = 10
#: ``INET_DIAG_NOCOOKIE``: match the socket by address, not by cookie.
NO_COOKIE = 0xFFFFFFFF
#: How long the kernel may take to answer (it answers at once).
TIMEOUT_SECONDS = 0.5

_NLMSGHDR = struct.Struct("=IHHII")
#: ``inet_diag_req_v2``: family, protocol, ext, pad, states; then ``inet_diag_sockid``:
#: sport, dport (big-endian), src[4], dst[4] (network order), interface, cookie[2].
_REQUEST_HEAD = struct.Struct("=BBBxI")
_PORTS = struct.Struct(">HH")
_REQUEST_TAIL = struct.Struct("=III")
#: ``inet_diag_msg``: family, state, timer, retrans, sockid (48 bytes), expires,
#: rqueue, wqueue, uid, inode.
_MESSAGE = struct.Struct("=BBBB48sIIIII")


def loopback_peer_uid(
    client_host: str, client_port: int, server_host: str, server_port: int
) -> int | None:
    """The uid owning the client socket of a loopback connection to this host.

    ``client_host:client_port`` is the peer as ``accept()`` saw it,
    ``server_host:server_port`` the local end (``getsockname()``). None when
    the kernel does not say (or the addresses are not loopback).
    """
    try:
        client = ip_address_of(client_host)
        server = ip_address_of(server_host)
    except ValueError:
        return None
    if not (client.is_loopback and server.is_loopback) or client_port <= 0 or server_port <= 0:
        return None
    family = socket.AF_INET if client.version == 4 else socket.AF_INET6
    try:
        found = _lookup(family, client_port, server_port, _packed(client), _packed(server))
    except OSError:
        return None
    return None if found is None else found[1]


@dataclass(frozen=True)
class ListenerOwner:
    """Who listens on a TCP port of this host, as the kernel says."""

    host: str
    port: int
    #: The user owning the listening socket (the one that created it).
    uid: int
    #: The socket's inode: the same listener as long as it is the same number.
    inode: int
    #: A process holding the socket; None when none could be found (a user sees only
    #: its own processes' descriptors).
    pid: int | None
    #: The process's name (``/proc/<pid>/comm``, which its owner sets: control
    #: characters removed, ``trainmon.terminal.one_line``); None without a pid.
    command: str | None
    #: The uid's name in the user database; None when it has none.
    user: str | None

    def __str__(self) -> str:
        """``pid 123 trainmon, uid 0 root``."""
        process = "pid unknown" if self.pid is None else f"pid {self.pid}"
        if self.command:
            process += f" {self.command}"
        return f"{process}, uid {self.uid}" + (f" {self.user}" if self.user else "")


def listener_owner(host: str, port: int, proc: Path = Path("/proc")) -> ListenerOwner | None:
    """The listening TCP socket a connection from this host to ``host:port`` reaches
    (bound to that address or to a wildcard), with its owner; None when nothing
    listens there (or ``host`` is not an address). ``host`` is an address of this
    host. ``OSError`` when the kernel cannot be asked (no ``sock_diag``)."""
    try:
        address = ip_address_of(host)
    except ValueError:
        return None
    if address.is_unspecified:
        address = ipaddress.ip_address("127.0.0.1" if address.version == 4 else "::1")
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    # The kernel's exact lookup (inet_diag_find_one_icsk) finds what a packet from
    # dst:dport to src:sport would: with no remote end, the listener on src:sport.
    found = _lookup(family, port, 0, _packed(address), bytes(16), 1 << TCP_LISTEN)
    if found is None or found[0] != TCP_LISTEN:
        return None
    _, uid, inode = found
    pid = socket_pid(inode, proc)
    return ListenerOwner(host=str(address), port=port, uid=uid, inode=inode, pid=pid,
                         command=None if pid is None else _command(pid, proc),
                         user=user_name(uid))


def socket_pid(inode: int, proc: Path = Path("/proc")) -> int | None:
    """The lowest pid with a descriptor on socket ``inode`` that this process may see."""
    target = f"socket:[{inode}]"
    try:
        pids = sorted(int(entry.name) for entry in os.scandir(proc) if entry.name.isdigit())
    except OSError:
        return None
    for pid in pids:
        try:
            descriptors = os.scandir(proc / str(pid) / "fd")
        except OSError:
            continue  # gone, or another user's
        with descriptors:
            for descriptor in descriptors:
                try:
                    if os.readlink(descriptor.path) == target:
                        return pid
                except OSError:
                    continue
    return None


def user_name(uid: int) -> str | None:
    """The name of ``uid`` in the user database, None when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _command(pid: int, proc: Path) -> str | None:
    try:
        return one_line((proc / str(pid) / "comm").read_text(errors="replace").strip())
    except OSError:
        return None


def _lookup(family: int, source_port: int, destination_port: int, source: bytes,
            destination: bytes, states: int = ALL_STATES) -> tuple[int, int, int] | None:
    """One exact ``sock_diag`` lookup of a TCP socket: its (state, uid, inode), None
    when the kernel knows no such socket; ``OSError`` when it cannot be asked."""
    request = b"".join((
        _REQUEST_HEAD.pack(family, socket.IPPROTO_TCP, 0, states),
        _PORTS.pack(source_port, destination_port), source, destination,
        _REQUEST_TAIL.pack(0, NO_COOKIE, NO_COOKIE),
    ))
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(request), SOCK_DIAG_BY_FAMILY,
                            NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(TIMEOUT_SECONDS)
        sock.sendto(header + request, (0, 0))
        answer = sock.recv(8192)
    return _socket_of(answer)


def ip_address_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address a socket reported for a peer: an IPv6 scope (``%eth0``) dropped, an
    IPv4-mapped IPv6 address (``::ffff:127.0.0.1``, what a dual-stack listener sees
    of an IPv4 client) as its IPv4 address; ``ValueError`` when it is not one."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _packed(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    """The address as ``__be32[4]``: IPv4 in the first word, the rest zero."""
    return address.packed.ljust(16, b"\0")


def _socket_of(answer: bytes) -> tuple[int, int, int] | None:
    """(state, uid, inode) of the ``inet_diag_msg`` answered; None for an error."""
    if len(answer) < _NLMSGHDR.size:
        return None
    length, kind, _, _, _ = _NLMSGHDR.unpack_from(answer)
    if kind != SOCK_DIAG_BY_FAMILY or length < _NLMSGHDR.size + _MESSAGE.size:
        return None  # an error message (NLMSG_ERROR): no such socket
    fields = _MESSAGE.unpack_from(answer, _NLMSGHDR.size)
    return int(fields[1]), int(fields[8]), int(fields[9])
