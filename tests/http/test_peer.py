"""Who listens on a port of this host, as the kernel says (``trainmon.http.peer``):
real sockets of this process, found by the same ``sock_diag`` lookup a connection's
peer is found by."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from testkit.daemon import free_port
from trainmon.http.peer import listener_owner, loopback_peer_uid


def listening(family: socket.AddressFamily, host: str, port: int = 0) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, port))
    sock.listen()
    return sock


@pytest.fixture
def own_pid_and_comm() -> Iterator[tuple[int, str]]:
    with open(f"/proc/{os.getpid()}/comm") as comm:
        yield os.getpid(), comm.read().strip()


@pytest.mark.parametrize("family, bound, asked", [
    (socket.AF_INET, "127.0.0.1", "127.0.0.1"),
    (socket.AF_INET, "0.0.0.0", "127.0.0.1"),   # a wildcard listener answers loopback
    (socket.AF_INET, "0.0.0.0", "0.0.0.0"),     # "connect to 0.0.0.0" is loopback
    (socket.AF_INET6, "::1", "::1"),
    (socket.AF_INET6, "::", "127.0.0.1"),       # dual stack: IPv4 clients reach it
])
def test_the_listener_a_connection_reaches_is_named(
        family: socket.AddressFamily, bound: str, asked: str,
        own_pid_and_comm: tuple[int, str]) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6")
    with listening(family, bound) as sock:
        port = sock.getsockname()[1]
        owner = listener_owner(asked, port)
        assert owner is not None
        assert (owner.uid, owner.pid, owner.command) == (os.geteuid(), *own_pid_and_comm)
        assert owner.inode == os.fstat(sock.fileno()).st_ino
        assert str(owner) == (f"pid {own_pid_and_comm[0]} {own_pid_and_comm[1]}, "
                              f"uid {os.geteuid()} {owner.user}")


def test_nothing_listening_is_none_and_a_connection_is_not_a_listener() -> None:
    port = free_port()
    assert listener_owner("127.0.0.1", port) is None
    assert listener_owner("not an address", port) is None
    with listening(socket.AF_INET, "127.0.0.1") as server, \
            socket.create_connection(server.getsockname()) as client:
        accepted, _ = server.accept()
        with accepted:
            client_host, client_port = client.getsockname()
            # the client socket of an established connection: found as a peer, not a listener
            assert loopback_peer_uid(client_host, client_port,
                                     *server.getsockname()) == os.geteuid()
            assert listener_owner(client_host, client_port) is None
