"""The configuration file: defaults, the documented keys, and errors with key paths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainmon.config import Config, load_config, parse_config
from trainmon.http.listen import ListenAddress, parse_listen_address
from trainmon.section import ConfigError, DeviceFilter

DESIGN_EXAMPLE = """
listen: "0.0.0.0:19400"
web_config_file: null
paths: {proc: /host/proc, sys: /host/sys}
collectors:
  gpu:        {enabled: auto}
  network:    {enabled: true, include: null, exclude: "^(lo|veth.*)$"}
  infiniband: {enabled: auto}
  disk:       {enabled: true, include: "^(nvme|sd)", exclude: null}
  training:   {enabled: true, socket: /run/trainmon/steps.sock, token_file: null, ttl_seconds: 300}
  tencent:
    enabled: false
    endpoint: https://monitor.tencentcloudapi.com
    region: ap-shanghai
    secret_id: ${TENCENTCLOUD_SECRET_ID}
    secret_key: ${TENCENTCLOUD_SECRET_KEY}
    instances: [ins-aaaaaaaa]
    disks: {ins-aaaaaaaa: [disk-bbbbbbbb]}
    period_seconds: 60
    delay_seconds: 120
    batch_size: 10
    rate_limit: 15
"""


def test_no_file_gives_the_built_in_defaults() -> None:
    config = load_config(None)
    assert config == Config()
    assert config.listen == ListenAddress("0.0.0.0", 19400)
    assert config.paths.proc == Path("/proc")
    assert config.collectors.network.devices.accepts("eth0")
    for virtual in ("lo", "veth12ab", "docker0", "cali123", "flannel.1", "cni0"):
        assert not config.collectors.network.devices.accepts(virtual)
    assert config.collectors.gpu.enabled == "auto"
    assert config.collectors.tencent.enabled is False


def test_the_design_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "trainmon.yml"
    path.write_text(DESIGN_EXAMPLE)
    environ = {"TENCENTCLOUD_SECRET_ID": "AKIDexample", "TENCENTCLOUD_SECRET_KEY": "s3cret"}
    config = load_config(path, environ)
    assert config.paths.proc == Path("/host/proc")
    assert config.collectors.disk.devices.accepts("nvme0n1")
    assert not config.collectors.disk.devices.accepts("vda")
    assert config.collectors.network.devices.accepts("docker0")
    assert config.collectors.tencent.secret_id == "AKIDexample"
    assert config.collectors.tencent.disks == {"ins-aaaaaaaa": ("disk-bbbbbbbb",)}
    assert config.collectors.training.ttl_seconds == 300.0


def test_config_is_frozen() -> None:
    config = parse_config({})
    with pytest.raises(AttributeError):
        config.listen = ListenAddress("127.0.0.1", 1)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"collectors": {"disk": {"exclude": "sd("}}},
            "collectors.disk.exclude: not a valid regular expression: missing ), unterminated",
        ),
        ({"collectors": {"disk": {"exlude": "x"}}}, "collectors.disk.exlude: unknown key"),
        ({"listn": ":1"}, "listn: unknown key"),
        ({"listen": "19400"}, "listen: expected host:port"),
        ({"listen": ":99999"}, "listen: port must be 0-65535"),
        ({"listen": 19400}, "listen: expected a string, got an integer"),
        (
            {"collectors": {"gpu": {"enabled": "yes"}}},
            "collectors.gpu.enabled: expected true, false or auto",
        ),
        (
            {"collectors": {"network": {"enabled": "auto"}}},
            "collectors.network.enabled: expected true or false",
        ),
        (
            {"collectors": {"training": {"ttl_seconds": -1}}},
            "collectors.training.ttl_seconds: must be >= 1",
        ),
        ({"collectors": {"training": {"ttl_seconds": ".inf"}}}, "expected a number, got a string"),
        (
            {"collectors": {"tencent": {"batch_size": 51}}},
            "collectors.tencent.batch_size: must be <= 50",
        ),
        (
            {"collectors": {"tencent": {"instances": "ins-1"}}},
            "collectors.tencent.instances: expected a list",
        ),
        (
            {"collectors": {"tencent": {"instances": [1]}}},
            "collectors.tencent.instances[0]: expected a string",
        ),
        (
            {"collectors": {"tencent": {"disks": {"ins-1": "d"}}}},
            "collectors.tencent.disks.ins-1: expected a list",
        ),
        ({"collectors": []}, "collectors: expected a mapping, got a list"),
        ({"paths": {"proc": None}}, "paths.proc: expected a string, got null"),
        ({"http": {"max_connections": 0}}, "http.max_connections: must be >= 1"),
        ([1, 2], "(top level): expected a mapping, got a list"),
    ],
)
def test_invalid_values_name_the_key_path(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(data, environ={})
    assert message in str(raised.value)


def test_every_error_of_a_file_is_raised_at_once() -> None:
    """One error per broken key, across sections, in the order they are read; a
    broken section does not hide the keys after it."""
    data = {
        "listen": "nowhere",
        "http": [],
        "paths": {"prok": "/host/proc"},
        "collectors": {"ledger": {"flush_second": 5, "max_runs": 0}, "trainng": {}},
    }
    with pytest.raises(ConfigError) as raised:
        parse_config(data, environ={})
    assert [(error.path, error.message.split(",")[0]) for error in raised.value.errors] == [
        ("listen", "expected host:port"),
        ("http", "expected a mapping"),
        ("paths.prok", "unknown key"),
        ("collectors.ledger.max_runs", "must be >= 1"),
        ("collectors.ledger.flush_second", "unknown key"),
        ("collectors.trainng", "unknown key"),
    ]
    messages = str(raised.value).splitlines()
    assert "collectors.ledger.flush_second: unknown key, did you mean flush_seconds?" in messages
    assert "collectors.trainng: unknown key, did you mean training?" in messages
    assert "paths.prok: unknown key, did you mean proc?" in messages


def test_infinite_numbers_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"collectors\.training\.ttl_seconds: expected a finite"):
        parse_config({"collectors": {"training": {"ttl_seconds": float("inf")}}})


def test_environment_references_expand_and_unset_ones_fail() -> None:
    data = {"collectors": {"tencent": {"secret_id": "${ID}", "region": "ap-$${literal}"}}}
    config = parse_config(data, environ={"ID": "AKID"})
    assert config.collectors.tencent.secret_id == "AKID"
    assert config.collectors.tencent.region == "ap-${literal}"
    with pytest.raises(ConfigError, match=r"collectors.tencent.secret_id: environment variable ID"):
        parse_config(data, environ={})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("listen: [unclosed", "is not valid YAML at line 1"),
        ("a: 1\n  b: 2\n", "is not valid YAML at line 2"),
        ("\xff\xfe", None),
    ],
)
def test_broken_files_give_a_clear_error(tmp_path: Path, text: str, message: str | None) -> None:
    path = tmp_path / "broken.yml"
    if message is None:
        path.write_bytes(b"\xff\xfe\x00bad")
        message = "is not UTF-8 text"
    else:
        path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*missing\.yml: No such file"):
        load_config(tmp_path / "missing.yml")


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yml"
    path.write_text("# nothing configured\n")
    assert load_config(path) == Config()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:19400", ListenAddress("0.0.0.0", 19400)),
        (":19400", ListenAddress("0.0.0.0", 19400)),
        ("localhost:80", ListenAddress("localhost", 80)),
        ("[::1]:19400", ListenAddress("::1", 19400)),
        ("[::]:0", ListenAddress("::", 0)),
    ],
)
def test_listen_addresses(text: str, expected: ListenAddress) -> None:
    assert parse_listen_address(text) == expected


def test_listen_address_prints_back() -> None:
    assert str(ListenAddress("::1", 1)) == "[::1]:1"
    assert str(ListenAddress("127.0.0.1", 2)) == "127.0.0.1:2"


def test_device_filter_include_then_exclude() -> None:
    devices = DeviceFilter(include=re.compile("^eth"), exclude=re.compile("^eth1$"))
    assert devices.accepts("eth0")
    assert not devices.accepts("eth1")
    assert not devices.accepts("ib0")
