"""A request's head: where it ends, the body it announces, and what it says.

The selector thread (``trainmon.http.connections``) reads requests into memory
before a worker answers them; ``head_end`` tells it when a head is whole and
``framing_of`` how much body follows (``Content-Length``,
``Transfer-Encoding: chunked``, ``Expect: 100-continue``); the worker reads the
head with ``parse_head``. Both read header lines by one rule
(``_header_lines``): a line with a name, a colon and no white space around the
name, the first occurrence of each name counting, so the body the selector
frames is the body the handler reads. The rules are those of Python's
``http.server``, which parsed requests before (lines end in LF or CRLF; at most
100 header lines; HTTP/0.9 requests, ``GET`` only; HTTP/2 and later refused).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal

__all__ = ["BodyState", "Framing", "HeadError", "RequestHead", "framing_of", "head_end",
           "parse_head"]

#: Header lines in a head at most (more: 431), and the longest line (longer: 431, or 414
#: for the request line), as ``http.client`` reads headers.
MAX_HEADER_LINES = 100
MAX_LINE_BYTES = 65536

#: What happened to a request's body before the request reached a worker:
#: ``none`` (no ``Content-Length``, or 0), ``read`` (in ``Request.data``),
#: ``discarded`` (over the body limit, read and dropped), ``unread`` (chunked,
#: unparseable length, or over ``MAX_DISCARDED_BODY_BYTES``: the connection must close).
BodyState = Literal["none", "read", "discarded", "unread"]


@dataclass(frozen=True)
class Framing:
    #: ``Content-Length`` (the first one), None without one.
    length: int | None
    #: The body cannot be framed by length (chunked, or a length that does not parse).
    unframed: bool
    expects_continue: bool


_NO_BODY = Framing(None, False, False)
#: A header line that ``framing_of`` reads (any case, as ``http.server`` compares them).
_FRAMING_HEADER = re.compile(rb"^(?:content-length|transfer-encoding|expect):",
                             re.IGNORECASE | re.MULTILINE)


def head_end(buffer: bytearray) -> int | None:
    """The length of the request head at the start of ``buffer`` (request line, header
    lines, the empty line), or None while it is incomplete. Lines end in LF or CRLF, as
    ``http.server`` reads them; a request line that is not two or three words ends the
    head by itself (the handler answers it without reading headers)."""
    line_end = buffer.find(b"\n")
    if line_end < 0:
        return None
    if not 2 <= len(buffer[:line_end].split()) <= 3:
        return line_end + 1
    crlf = buffer.find(b"\n\r\n", line_end)
    bare = buffer.find(b"\n\n", line_end, None if crlf < 0 else crlf)
    if bare >= 0:
        return bare + 2
    return None if crlf < 0 else crlf + 3


def framing_of(head: bytes) -> Framing:
    """The body framing a request head announces (first occurrence of each header,
    as the handler reads it)."""
    if _FRAMING_HEADER.search(head) is None:  # a scrape: no body, nothing to parse
        return _NO_BODY
    lines = head.split(b"\n")
    words = lines[0].split()
    version = words[2] if len(words) == 3 else b"HTTP/0.9"
    seen = {name.lower(): value.strip() for name, value in _header_lines(lines[1:])}
    chunked = b"chunked" in seen.get(b"transfer-encoding", b"").lower()
    raw_length = seen.get(b"content-length")
    length: int | None = None
    unframed = chunked
    if raw_length is not None and not chunked:
        try:
            length = int(raw_length)
        except ValueError:
            unframed = True
        else:
            if length < 0:
                length, unframed = None, True
    expects = (seen.get(b"expect", b"").lower() == b"100-continue"
               and version.upper() >= b"HTTP/1.1")
    return Framing(length, unframed, expects)


def _header_lines(lines: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """(name, value) of each header line, the first occurrence of a name only; a line
    that is not one (a continuation, no colon, white space around the name) is skipped."""
    seen: set[bytes] = set()
    for line in lines:
        name, colon, value = line.partition(b":")
        if colon and name and not name[:1].isspace() and name == name.strip():
            key = name.lower()
            if key not in seen:
                seen.add(key)
                yield name, value


class HeadError(ValueError):
    """A head answered with an error status, and the connection closed."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(f"{status.value} {reason}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class RequestHead:
    """What a request's head says."""

    method: str
    #: The request target (a path, with its query), a leading ``//`` made ``/``.
    target: str
    #: ``HTTP/1.1``, ``HTTP/1.0``, …; ``HTTP/0.9`` for a request line of two words.
    version: str
    #: Header name (lower case) → value (the first occurrence; ISO-8859-1, leading blanks
    #: and the line end removed).
    headers: Mapping[str, str]
    #: The connection stays open after the answer (HTTP/1.1 unless ``Connection: close``;
    #: HTTP/1.0 with ``Connection: keep-alive``).
    keep_alive: bool

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)


def parse_head(head: bytes) -> RequestHead | None:
    """The request line and headers of ``head`` (up to and with its empty line); None for
    an empty request line (the connection is closed without an answer). ``HeadError``
    for what ``http.server`` answered 400, 414, 431 or 505 to."""
    lines = head.split(b"\n")
    if len(lines[0]) > MAX_LINE_BYTES:
        raise HeadError(HTTPStatus.REQUEST_URI_TOO_LONG, "Request-URI too long")
    words = lines[0].decode("iso-8859-1").rstrip("\r\n").split()
    if not words:
        return None
    version, keep_alive = "HTTP/0.9", False
    if len(words) >= 3:
        version = words[-1]
        number = _version_number(version)
        if number is None:
            raise HeadError(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
        if number >= (2, 0):
            raise HeadError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED,
                            f"Invalid HTTP version ({version})")
        keep_alive = number >= (1, 1)
    if not 2 <= len(words) <= 3:
        raise HeadError(HTTPStatus.BAD_REQUEST, "Bad request syntax")
    method, target = words[:2]
    if len(words) == 2 and method != "GET":
        raise HeadError(HTTPStatus.BAD_REQUEST, f"Bad HTTP/0.9 request type ({method!r})")
    if target.startswith("//"):  # one leading slash (gh-87389)
        target = "/" + target.lstrip("/")
    header_lines = [line for line in lines[1:] if line.strip()]
    if len(header_lines) > MAX_HEADER_LINES:
        raise HeadError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
    if any(len(line) > MAX_LINE_BYTES for line in header_lines):
        raise HeadError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
    headers = {name.decode("iso-8859-1").lower():
               value.decode("iso-8859-1").lstrip(" \t").rstrip("\r\n")
               for name, value in _header_lines(header_lines)}
    connection = headers.get("connection", "").lower()
    if connection == "close":
        keep_alive = False
    elif connection == "keep-alive":
        keep_alive = True
    return RequestHead(method, target, version, headers, keep_alive and len(words) == 3)


def _version_number(version: str) -> tuple[int, int] | None:
    """``HTTP/1.1`` → (1, 1); None unless ``HTTP/`` and two numbers of at most 10 digits."""
    if not version.startswith("HTTP/"):
        return None
    parts = version[5:].split(".")
    if len(parts) != 2 or not all(part.isascii() and part.isdigit() and len(part) <= 10
                                  for part in parts):
        return None
    return int(parts[0]), int(parts[1])
