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
"""

from __future__ import annotations

import ipaddress
import socket
import struct

#: ``NETLINK_SOCK_DIAG`` and its request type ``SOCK_DIAG_BY_FAMILY`` (linux/sock_diag.h).
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
#: Every TCP state (a bit per state).
ALL_STATES = 0xFFFFFFFF
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
    request = b"".join((
        _REQUEST_HEAD.pack(family, socket.IPPROTO_TCP, 0, ALL_STATES),
        _PORTS.pack(client_port, server_port), _packed(client), _packed(server),
        _REQUEST_TAIL.pack(0, NO_COOKIE, NO_COOKIE),
    ))
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(request), SOCK_DIAG_BY_FAMILY,
                            NLM_F_REQUEST, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(TIMEOUT_SECONDS)
            sock.sendto(header + request, (0, 0))
            answer = sock.recv(8192)
    except OSError:
        return None
    return _uid_of(answer)


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


def _uid_of(answer: bytes) -> int | None:
    if len(answer) < _NLMSGHDR.size:
        return None
    length, kind, _, _, _ = _NLMSGHDR.unpack_from(answer)
    if kind != SOCK_DIAG_BY_FAMILY or length < _NLMSGHDR.size + _MESSAGE.size:
        return None  # an error message (NLMSG_ERROR): no such socket
    fields = _MESSAGE.unpack_from(answer, _NLMSGHDR.size)
    return int(fields[8])
