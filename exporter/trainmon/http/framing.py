"""Where a request ends: its head, and the body its head announces.

The selector thread (``trainmon.http.connections``) reads requests into memory
before a worker parses them with ``http.server``; these two functions tell it
when a head is whole (``head_end``, with the line rules ``http.server``
reads by) and how much body follows (``framing_of``: ``Content-Length``,
``Transfer-Encoding: chunked``, ``Expect: 100-continue``; the first
occurrence of each header, as the handler reads it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["BodyState", "Framing", "framing_of", "head_end"]

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
    seen: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon and name and not name[:1].isspace() and name == name.strip():
            # a header line as the email parser reads one (not a continuation)
            seen.setdefault(name.lower(), value.strip())
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
