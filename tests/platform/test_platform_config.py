"""``collectors.platform``: defaults, label validation and errors with their key path."""

from __future__ import annotations

import pytest

from trainmon.config import parse_config
from trainmon.platform.config import PlatformConfig
from trainmon.section import ConfigError


def platform(section: object) -> PlatformConfig:
    return parse_config({"collectors": {"platform": section}}).collectors.platform


def test_defaults() -> None:
    config = parse_config({}).collectors.platform
    assert config == PlatformConfig()
    assert (config.enabled, config.provider) == ("auto", "auto")
    assert config.metadata_url == "http://metadata.tencentyun.com"
    assert (config.spot_interval_seconds, config.identity_interval_seconds) == (5.0, 600.0)
    assert config.timeout_seconds == 1.0 and config.spot is None and config.labels == {}


def test_a_full_section() -> None:
    config = platform({
        "enabled": True, "provider": "self-hosted", "metadata_url": "http://169.254.0.23/",
        "spot_interval_seconds": 10, "identity_interval_seconds": 300, "timeout_seconds": 2,
        "labels": {"rack": "r12", "leaf": "leaf-07", "zone": "dc1-hall2"}, "spot": False,
    })
    assert config.metadata_url == "http://169.254.0.23"
    assert list(config.labels) == ["leaf", "rack", "zone"]
    assert config.extra_labels == ("leaf", "rack")
    assert config.spot is False and config.timeout_seconds == 2.0


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        ({"labels": {"1rack": "r1"}}, "collectors.platform.labels.1rack", "not a Prometheus label"),
        ({"labels": {"rack-id": "r1"}}, "collectors.platform.labels.rack-id", "label name"),
        ({"labels": {"__rack": "r1"}}, "collectors.platform.labels.__rack", "leading __"),
        ({"labels": {"node": "n1"}}, "collectors.platform.labels.node", "set by Prometheus"),
        ({"labels": {"instance": "n1"}}, "collectors.platform.labels.instance", "Prometheus"),
        ({"labels": {"provider": "aws"}}, "collectors.platform.labels.provider", "fixed label"),
        ({"labels": {"instance_id": "x"}}, "collectors.platform.labels.instance_id", "fixed"),
        ({"provider": "tencent", "labels": {"zone": "z"}}, "collectors.platform.labels.zone",
         "self-hosted nodes only"),
        ({"labels": {"rack": ""}}, "collectors.platform.labels.rack", "empty value"),
        ({"labels": {"rack": "r" * 129}}, "collectors.platform.labels.rack", "128 characters"),
        ({"labels": {"rack": 12}}, "collectors.platform.labels.rack", "expected a string"),
        ({"labels": {f"l{i}": "v" for i in range(17)}}, "collectors.platform.labels", "at most 16"),
        ({"labels": ["leaf"]}, "collectors.platform.labels", "expected a mapping"),
        ({"provider": "aws"}, "collectors.platform.provider", "auto, tencent, self-hosted"),
        ({"enabled": "yes"}, "collectors.platform.enabled", "true, false or auto"),
        ({"metadata_url": "metadata.tencentyun.com"}, "collectors.platform.metadata_url", "URL"),
        ({"spot": "yes"}, "collectors.platform.spot", "true, false or null"),
        ({"spot_interval_seconds": 0.5}, "collectors.platform.spot_interval_seconds", ">= 1"),
        ({"identity_interval_seconds": 1}, "collectors.platform.identity_interval_seconds", ">="),
        ({"timeout_seconds": 3}, "collectors.platform.timeout_seconds", "half of spot_interval"),
        ({"interval": 5}, "collectors.platform.interval", "unknown key"),
    ],
)
def test_errors_name_the_key_path(section: object, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        platform(section)
    assert caught.value.path == path
    assert message in caught.value.message


def test_self_hosted_identity_labels_are_allowed_under_auto() -> None:
    config = platform({"labels": {"zone": "dc1", "region": "bj", "instance_type": "8xH100"}})
    assert config.extra_labels == ()
