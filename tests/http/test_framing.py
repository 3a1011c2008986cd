"""A request head: where it ends and the body it announces (the selector thread), and what
it says (the worker), by the rules ``http.server`` read requests with."""

from __future__ import annotations

import pytest

from trainmon.http.framing import (
    Framing,
    HeadError,
    RequestHead,
    framing_of,
    head_end,
    parse_head,
)


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


def head(text: str) -> RequestHead | None:
    return parse_head(text.encode("iso-8859-1"))


def test_a_head_says_its_method_target_version_and_headers() -> None:
    parsed = head("GET //metrics?x=1 HTTP/1.1\r\nAccept:  text/plain \r\nACCEPT: other\r\n"
                  " folded: continuation\r\nbroken line\r\nX-Empty:\r\n\r\n")
    assert parsed is not None
    assert (parsed.method, parsed.target, parsed.version) == ("GET", "/metrics?x=1", "HTTP/1.1")
    # the first occurrence, leading blanks removed (trailing ones kept, as http.server did)
    assert parsed.header("accept") == "text/plain "
    assert parsed.header("x-empty") == "" and parsed.header("folded") == ""
    assert parsed.keep_alive


@pytest.mark.parametrize(("text", "keep_alive"), [
    ("GET / HTTP/1.1\r\n\r\n", True),
    ("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n", False),
    ("GET / HTTP/1.0\r\n\r\n", False),
    ("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", True),
    ("GET /\r\nConnection: keep-alive\r\n\r\n", False),  # HTTP/0.9 closes whatever it says
])
def test_which_connections_stay_open(text: str, keep_alive: bool) -> None:
    parsed = head(text)
    assert parsed is not None and parsed.keep_alive is keep_alive


@pytest.mark.parametrize(("text", "status"), [
    ("GET / HTTP/1.x\r\n\r\n", 400),
    ("GET / FTP/1.1\r\n\r\n", 400),
    ("GET / HTTP/1.\u00b2\r\n\r\n", 400),  # a digit that int() refuses
    ("GET / HTTP/12345678901.1\r\n\r\n", 400),
    ("GET / HTTP/2.0\r\n\r\n", 505),
    ("GET / extra HTTP/1.1\r\n\r\n", 400),
    ("POST /api/v1/steps\r\n\r\n", 400),  # HTTP/0.9 knows GET only
    ("GET / HTTP/1.1\r\n" + "X-A: 1\r\n" * 101 + "\r\n", 431),
    ("GET / HTTP/1.1\r\nX-A: " + "a" * 70000 + "\r\n\r\n", 431),
    ("GET /" + "a" * 70000 + " HTTP/1.1\r\n\r\n", 414),
])
def test_what_http_server_refused_is_refused_with_its_status(text: str, status: int) -> None:
    with pytest.raises(HeadError) as refused:
        head(text)
    assert refused.value.status == status


def test_an_empty_request_line_is_no_request() -> None:
    assert head("\r\n") is None
    assert head(" \r\n\r\n") is None
