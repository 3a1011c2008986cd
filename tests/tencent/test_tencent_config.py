"""Validation of the ``collectors.tencent`` section."""

from __future__ import annotations

from typing import Any

import pytest

from trainmon.config import parse_config
from trainmon.section import ConfigError

ENV = {"KEY": "the-secret-value", "TOKEN": "the-session-token"}


def parse(**keys: Any) -> Any:
    return parse_config({"collectors": {"tencent": {"enabled": True, **keys}}}, ENV).collectors.tencent


def test_defaults_ask_the_metadata_service_for_region() -> None:
    config = parse()
    assert config.region is None and config.target_regions == (None,)
    assert (config.period_seconds, config.delay_seconds, config.batch_size) == (60, 120, 10)
    assert config.rate_limit == 15.0


def test_secrets_come_from_the_environment_and_stay_out_of_repr() -> None:
    config = parse(secret_id="AKIDx", secret_key="${KEY}", session_token="${TOKEN}")
    assert config.secret_key == "the-secret-value"
    assert config.session_token == "the-session-token"
    assert "the-secret-value" not in repr(config)
    assert "the-session-token" not in repr(config)


@pytest.mark.parametrize("key", ["secret_key", "session_token"])
def test_inline_secrets_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"collectors\.tencent\.{key}: must be a \$\{{VAR\}}"):
        parse(secret_id="AKIDx", **{key: "pasted-secret"})


def test_unset_environment_variable_is_an_error() -> None:
    with pytest.raises(ConfigError, match="MISSING is not set"):
        parse(secret_id="AKIDx", secret_key="${MISSING}")


@pytest.mark.parametrize(
    ("keys", "path", "message"),
    [
        ({"secret_id": "AKIDx"}, "secret_id", "needs secret_key"),
        ({"secret_key": "${KEY}"}, "secret_key", "needs secret_id"),
        ({"secret_id": "a", "secret_key": "${KEY}", "secret_key_file": "/k"},
         "secret_key_file", "not both"),
        ({"region": "ap-shanghai", "regions": ["ap-beijing"]}, "regions", "not both"),
        ({"regions": ["ap-shanghai", "ap-beijing"], "instances": ["ins-1"]}, "instances",
         "single region"),
        ({"disks": {"ins-1": ["disk-1"]}}, "disks", "needs instances"),
        ({"instances": ["ins-1"], "discovery_tags": {"team": "a"}}, "discovery_tags",
         "no effect"),
        ({"metrics": ["GpuUtil", "NoSuchMetric"]}, "metrics", "unknown metric"),
        ({"batch_size": 51}, "batch_size", "must be <= 50"),
        ({"rate_limit": 25}, "rate_limit", "must be <= 20"),
        ({"endpoint": "monitor.tencentcloudapi.com"}, "endpoint", "expected http"),
        ({"colour": "blue"}, "colour", "unknown key"),
    ],
)
def test_invalid_sections_name_the_key(keys: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse(**keys)
    assert raised.value.path == f"collectors.tencent.{path}"
    assert message in raised.value.message


def test_metric_names_are_case_insensitive_and_discovery_keys_parse() -> None:
    config = parse(metrics=["gpuutil", "DISKUTIL"], discovery_tags={"team": "training", "gpu": ""},
                   regions=["ap-shanghai", "ap-beijing"], endpoint="https://monitor.internal.tencentcloudapi.com/")
    assert config.metrics == ("gpuutil", "DISKUTIL")
    assert config.discovery_tags == {"team": "training", "gpu": ""}
    assert config.target_regions == ("ap-shanghai", "ap-beijing")
    assert config.endpoint == "https://monitor.internal.tencentcloudapi.com"
