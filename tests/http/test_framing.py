"""Where a request ends, as the selector thread decides it before ``http.server`` parses."""

from __future__ import annotations

import pytest

from trainmon.http.framing import Framing, framing_of, head_end


@pytest.mark.parametrize(
    ("received", "end"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\nNEXT", 27),
        (b"GET / HTTP/1.1\nHost: x\n\nNEXT", 24),  # bare LF, as http.server reads it
        (b"GET / HTTP/1.1\r\n\r\n", 18),  # no headers
        (b"GET /\r\n\r\n", 9),  # HTTP/0.9: headers are still read
        (b"GET / HTTP/1.1\r\nHost: x\r\n", None),  # headers still arriving
        (b"GET / HTTP/1.1", None),  # the request line still arriving
        (b"\r\n", 2),  # an empty request line: the handler closes at once
        (b"BREW /pot HTTP/1.1 extra\r\nHost", 26),  # not 2-3 words: answered 400 unread
    ],
)
def test_the_head_ends_at_the_first_empty_line(received: bytes, end: int | None) -> None:
    assert head_end(bytearray(received)) == end


@pytest.mark.parametrize(
    ("head", "framing"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Framing(None, False, False)),
        (b"POST / HTTP/1.1\r\ncontent-LENGTH: 12\r\nContent-Length: 99\r\n\r\n",
         Framing(12, False, False)),  # the first one, as the handler reads it
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n",
         Framing(None, True, False)),
        (b"POST / HTTP/1.1\r\nContent-Length: ten\r\n\r\n", Framing(None, True, False)),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", Framing(None, True, False)),
        (b"POST / HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-Continue\r\n\r\n",
         Framing(4, False, True)),
        (b"POST / HTTP/1.0\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n",
         Framing(4, False, False)),  # no interim responses before HTTP/1.1
        (b"POST / HTTP/1.1\r\nX-A: 1\r\n Content-Length: 4\r\nContent-Length : 5\r\n\r\n",
         Framing(None, False, False)),  # a continuation line, and a name with a space
    ],
)
def test_the_body_a_head_announces(head: bytes, framing: Framing) -> None:
    assert framing_of(head) == framing
