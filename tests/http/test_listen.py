"""The ``http`` section: its new limits are read from the configuration, with their rules."""

from __future__ import annotations

import pytest

from trainmon.config import parse_config
from trainmon.http.listen import HTTPConfig
from trainmon.section import ConfigError


def test_the_connection_limits_are_read_from_the_http_section() -> None:
    http = parse_config({"http": {
        "max_workers": 2, "max_header_bytes": 4096, "max_buffered_body_bytes": 4 << 20,
        "max_buffered_response_bytes": 8 << 20, "max_connections": 100,
        "max_connections_per_client": 10,
    }}, environ={}).http
    assert http == HTTPConfig(max_workers=2, max_header_bytes=4096,
                              max_buffered_body_bytes=4 << 20,
                              max_buffered_response_bytes=8 << 20, max_connections=100,
                              max_connections_per_client=10)


@pytest.mark.parametrize(
    ("http", "message"),
    [
        ({"max_request_body_bytes": 2 << 20, "max_buffered_body_bytes": 1 << 20},
         "http.max_buffered_body_bytes: must be at least max_request_body_bytes"),
        ({"max_workers": 0}, "http.max_workers: must be >= 1"),
        ({"max_header_bytes": 100}, "http.max_header_bytes: must be >= 1024"),
    ],
)
def test_limits_that_cannot_hold_are_refused(http: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"http": http}, environ={})
    assert message in str(raised.value)
