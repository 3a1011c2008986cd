"""How the client delivers a payload: unix datagram or HTTP POST. Standard library only.

``TRAINMON_ENDPOINT`` (or the ``endpoint`` argument) selects it:

- ``unix:///path/to/steps.sock``: one non-blocking ``sendto`` per payload; a
  missing daemon fails at once, a full receive queue (``EAGAIN``) is retried
  with backoff for up to ``FULL_QUEUE_RETRY_BUDGET_SECONDS`` before the
  payload counts as undelivered;
- ``http://host:port`` or ``https://host:port`` (path defaults to
  ``/api/v1/steps``): one POST per payload through ``trainmon.outbound``, the
  whole request within ``HTTP_TIMEOUT_SECONDS``; a token from
  ``TRAINMON_TOKEN`` (or the ``token`` argument) is sent as
  ``Authorization: Bearer …``, needed when the daemon is not on loopback.

Without either, ``default_endpoint``: the unix socket of this user's own
daemon when one listens there, else ``/run/trainmon/steps.sock``
(``trainmon.paths.client_socket_path`` has the rule).

``send(payload, timeout)`` takes at most the smaller of ``timeout`` and the
sender's own bound above, which is how ``Reporter.close()`` keeps its bound.
A sender never raises: ``send`` returns False and keeps ``last_error``.
"""

from __future__ import annotations

import array
import random
import socket
import time
import urllib.parse
from collections.abc import Mapping
from typing import Protocol

from trainmon import outbound
from trainmon.paths import client_socket_path
from trainmon.training.protocol import STEPS_PATH

#: Seconds one HTTP delivery (connect to the last byte of the answer) may take
#: before it counts as undelivered.
HTTP_TIMEOUT_SECONDS = 2.0
#: Longest answer of the daemon read, bytes (a JSON object of a few hundred).
MAX_ANSWER_BYTES = 64 * 1024
#: Seconds a datagram refused because the daemon's queue is full (EAGAIN) is
#: retried, in all, before it counts as undelivered.
FULL_QUEUE_RETRY_BUDGET_SECONDS = 1.0
#: First and longest pause between those retries (doubling, with jitter).
FULL_QUEUE_FIRST_PAUSE_SECONDS = 0.001
FULL_QUEUE_MAX_PAUSE_SECONDS = 0.025


class Sender(Protocol):
    last_error: str

    def send(self, payload: bytes, timeout: float | None = None) -> bool:
        """Deliver ``payload`` within ``timeout`` seconds and the sender's own bound."""
        ...

    def close(self) -> None: ...


class UnixDatagramSender:
    """Non-blocking datagrams to the daemon's socket.

    Linux refuses a datagram (EAGAIN) once ``net.unix.max_dgram_qlen``
    datagrams (often only 10) wait in the daemon's queue, which a burst of
    reports from many ranks of one node reaches for a moment. Such a datagram
    is retried after 1, 2, 4… ms (at most ``FULL_QUEUE_MAX_PAUSE_SECONDS``,
    jittered so that the ranks do not retry in step) for up to
    ``FULL_QUEUE_RETRY_BUDGET_SECONDS`` in all. This runs on the reporter's
    sender thread (and in ``close()``), never in the training loop.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.last_error = ""
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def send(self, payload: bytes, timeout: float | None = None) -> bool:
        return self._deliver(payload, None, timeout)

    def send_attached(self, payload: bytes, descriptor: int,
                      timeout: float | None = None) -> bool:
        """``send`` with an open file descriptor beside the payload (``SCM_RIGHTS``: a
        profile's trace, ``trainmon.client.profiling``); the daemon gets its own copy."""
        return self._deliver(payload, descriptor, timeout)

    def _deliver(self, payload: bytes, descriptor: int | None, timeout: float | None) -> bool:
        budget = FULL_QUEUE_RETRY_BUDGET_SECONDS
        if timeout is not None:
            budget = min(timeout, budget)
        give_up = time.monotonic() + budget
        pause = FULL_QUEUE_FIRST_PAUSE_SECONDS
        rights = [] if descriptor is None else [
            (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [descriptor]))]
        while True:
            try:
                if rights:
                    self._socket.sendmsg([payload], rights, 0, self.path)
                else:
                    self._socket.sendto(payload, self.path)
                return True
            except BlockingIOError as error:  # the daemon's queue is full
                self.last_error = f"unix://{self.path}: {error.strerror or error}"
            except OSError as error:  # ENOENT/ECONNREFUSED: no daemon; EMSGSIZE
                self.last_error = f"unix://{self.path}: {error.strerror or error}"
                return False
            left = give_up - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, pause * (0.5 + random.random())))
            pause = min(pause * 2, FULL_QUEUE_MAX_PAUSE_SECONDS)

    def close(self) -> None:
        self._socket.close()


class HTTPSender:
    """POSTs to the daemon's ``/api/v1/steps`` (one short-lived connection per payload)."""

    def __init__(
        self, url: urllib.parse.SplitResult, token: str | None,
        fetch: outbound.Fetch = outbound.request,
    ) -> None:
        self.url = url
        self.last_error = ""
        path = url.path if url.path not in ("", "/") else STEPS_PATH
        self._target = urllib.parse.urlunsplit((url.scheme, url.netloc, path, url.query, ""))
        self._headers = {"Content-Type": "application/x-ndjson"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._fetch = fetch

    def send(self, payload: bytes, timeout: float | None = None) -> bool:
        limit = HTTP_TIMEOUT_SECONDS if timeout is None else min(timeout, HTTP_TIMEOUT_SECONDS)
        if limit <= 0:
            self.last_error = f"{self.url.geturl()}: no time left to deliver"
            return False
        try:
            response = self._fetch("POST", self._target, body=payload, headers=self._headers,
                                   timeout=limit, max_body_bytes=MAX_ANSWER_BYTES)
        except outbound.OutboundError as error:  # its text starts with host:port
            self.last_error = f"{self.url.scheme}://{error}"
            return False
        if response.status != 200:
            detail = response.body[:4096].decode("utf-8", "replace").strip()
            self.last_error = f"{self.url.geturl()}: HTTP {response.status} {detail}"
            return False
        return True

    def close(self) -> None:
        pass


class DisabledSender:
    """Stands in for an endpoint that could not be parsed: every report is undelivered."""

    def __init__(self, reason: str) -> None:
        self.last_error = reason

    def send(self, payload: bytes, timeout: float | None = None) -> bool:
        return False

    def close(self) -> None:
        pass


def default_endpoint(environ: Mapping[str, str] | None = None) -> str:
    """``unix://`` and the socket a client of this user sends to by default,
    decided once, now (``environ``: ``XDG_RUNTIME_DIR``; ``os.environ`` if None)."""
    return f"unix://{client_socket_path(environ)}"


def open_sender(endpoint: str, token: str | None) -> Sender:
    """A sender for ``endpoint``; a bad endpoint gives a ``DisabledSender``, never an error."""
    url = urllib.parse.urlsplit(endpoint)
    if url.scheme == "unix" and url.path.startswith("/") and not url.netloc:
        try:
            return UnixDatagramSender(url.path)
        except OSError as error:  # e.g. out of file descriptors
            return DisabledSender(f"cannot open a unix socket: {error}")
    if url.scheme in ("http", "https") and url.hostname:
        try:
            url.port  # noqa: B018 - validates the port
        except ValueError:
            return DisabledSender(f"invalid port in TRAINMON_ENDPOINT {endpoint!r}")
        return HTTPSender(url, token)
    return DisabledSender(
        f"unsupported TRAINMON_ENDPOINT {endpoint!r} "
        "(expected unix:///path/to/steps.sock or http://host:port)"
    )
