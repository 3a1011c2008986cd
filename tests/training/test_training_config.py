"""The ``collectors.training`` configuration section."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmon.config import parse_config
from trainmon.paths import default_socket_path
from trainmon.section import ConfigError


def test_defaults() -> None:
    training = parse_config({}).collectors.training
    assert training.socket == default_socket_path()  # the suite's $RUNTIME_DIRECTORY
    assert default_socket_path(environ={}, euid=0) == Path("/run/trainmon/steps.sock")
    assert default_socket_path(environ={"RUNTIME_DIRECTORY": "/run/x"}) == Path(
        "/run/x/steps.sock")
    assert (training.ttl_seconds, training.max_jobs, training.max_ranks_per_job) == (300, 64, 1024)
    assert (training.socket_mode, training.window_seconds, training.max_label_length) == (
        0o666, 60.0, 128,
    )


def test_every_key_is_read() -> None:
    training = parse_config({"collectors": {"training": {
        "socket": "/tmp/x.sock", "token_file": "/etc/trainmon/token", "ttl_seconds": 60,
        "max_jobs": 8, "max_ranks_per_job": 16, "socket_mode": "0660",
        "receive_buffer_bytes": 1 << 22, "window_seconds": 30, "max_label_length": 64,
    }}}).collectors.training
    assert training.socket == Path("/tmp/x.sock")
    assert training.token_file == Path("/etc/trainmon/token")
    assert (training.socket_mode, training.receive_buffer_bytes) == (0o660, 1 << 22)
    assert (training.window_seconds, training.max_label_length) == (30, 64)


def test_socket_can_be_disabled() -> None:
    assert parse_config({"collectors": {"training": {"socket": None}}}).collectors.training.socket \
        is None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("socket_mode", "0999", "octal"),
        ("socket_mode", 432, "expected a string"),  # YAML's unquoted 0660
        ("window_seconds", 0, ">= 1"),
        ("max_label_length", 4, ">= 8"),
        ("receive_buffer_bytes", 10, ">= 4096"),
        ("ttl", 5, "unknown key"),
    ],
)
def test_invalid_values_name_their_key(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"collectors": {"training": {key: value}}})
    assert raised.value.path == f"collectors.training.{key}"
    assert message in str(raised.value)
