"""How the client delivers a payload: unix datagram or HTTP POST. Standard library only.

``TRAINMON_ENDPOINT`` (or the ``endpoint`` argument) selects it:

- ``unix:///run/trainmon/steps.sock`` (the default): one non-blocking
  ``sendto`` per report; a missing daemon or a full socket buffer fails at once;
- ``http://host:port`` or ``https://host:port`` (path defaults to
  ``/api/v1/steps``): one POST per report with a short timeout; a token from
  ``TRAINMON_TOKEN`` (or the ``token`` argument) is sent as
  ``Authorization: Bearer …``, needed when the daemon is not on loopback.

A sender never raises: ``send`` returns False and keeps ``last_error``.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.parse
from typing import Protocol

from trainmon.training.protocol import STEPS_PATH

DEFAULT_ENDPOINT = "unix:///run/trainmon/steps.sock"
#: Seconds an HTTP delivery may take before it counts as undelivered.
HTTP_TIMEOUT_SECONDS = 2.0
#: Pauses between retries of a datagram refused because the daemon's queue is full.
FULL_QUEUE_RETRY_SECONDS = (0.001, 0.002, 0.004, 0.008, 0.016)


class Sender(Protocol):
    last_error: str

    def send(self, payload: bytes) -> bool: ...

    def close(self) -> None: ...


class UnixDatagramSender:
    """Non-blocking datagrams to the daemon's socket.

    A full receive queue (EAGAIN) is retried a few times with short sleeps
    (``FULL_QUEUE_RETRY_SECONDS``, 31 ms in all): Linux refuses a datagram once
    ``net.unix.max_dgram_qlen`` datagrams (often only 10) wait in the daemon's
    queue, which a burst of reports from many ranks can reach for a moment.
    This runs on the reporter's sender thread, never in the training loop.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.last_error = ""
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def send(self, payload: bytes) -> bool:
        for pause in (*FULL_QUEUE_RETRY_SECONDS, None):
            try:
                self._socket.sendto(payload, self.path)
                return True
            except BlockingIOError as error:  # the daemon's queue is full
                self.last_error = f"unix://{self.path}: {error.strerror or error}"
                if pause is not None:
                    time.sleep(pause)
            except OSError as error:  # ENOENT/ECONNREFUSED: no daemon; EMSGSIZE
                self.last_error = f"unix://{self.path}: {error.strerror or error}"
                return False
        return False

    def close(self) -> None:
        self._socket.close()


class HTTPSender:
    """POSTs to the daemon's ``/api/v1/steps`` (one short-lived connection per report)."""

    def __init__(self, url: urllib.parse.SplitResult, token: str | None) -> None:
        self.url = url
        self.last_error = ""
        self._path = url.path if url.path not in ("", "/") else STEPS_PATH
        self._headers = {"Content-Type": "application/x-ndjson"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def send(self, payload: bytes) -> bool:
        connection: http.client.HTTPConnection
        if self.url.scheme == "https":
            connection = http.client.HTTPSConnection(self.url.netloc, timeout=HTTP_TIMEOUT_SECONDS)
        else:
            connection = http.client.HTTPConnection(self.url.netloc, timeout=HTTP_TIMEOUT_SECONDS)
        try:
            connection.request("POST", self._path, body=payload, headers=self._headers)
            response = connection.getresponse()
            body = response.read(4096)
        except (OSError, http.client.HTTPException) as error:
            self.last_error = f"{self.url.geturl()}: {error}"
            return False
        finally:
            connection.close()
        if response.status != 200:
            detail = body.decode("utf-8", "replace").strip()
            self.last_error = f"{self.url.geturl()}: HTTP {response.status} {detail}"
            return False
        return True

    def close(self) -> None:
        pass


class DisabledSender:
    """Stands in for an endpoint that could not be parsed: every report is undelivered."""

    def __init__(self, reason: str) -> None:
        self.last_error = reason

    def send(self, payload: bytes) -> bool:
        return False

    def close(self) -> None:
        pass


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
