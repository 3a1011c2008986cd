"""The ``collectors.gpu`` configuration section."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from trainmon.collectors.gpu import GPUConfig
from trainmon.config import parse_config
from trainmon.section import ConfigError


def gpu(section: Mapping[str, object]) -> GPUConfig:
    return parse_config({"collectors": {"gpu": section}}).collectors.gpu


def test_defaults() -> None:
    assert gpu({}) == GPUConfig(
        enabled="auto",
        window_seconds=60.0,
        sample_interval_seconds=1.0,
        process_interval_seconds=15.0,
        idle_threshold=0.1,
        busy_threshold=0.5,
        retry_seconds=10.0,
        gpm=True,
        gpm_interval_seconds=1.0,
        health_interval_seconds=60.0,
    )
    assert gpu({}).gpm_enabled


def test_every_key_is_read() -> None:
    section = {
        "enabled": True,
        "window_seconds": 30,
        "sample_interval_seconds": 0.5,
        "process_interval_seconds": 60,
        "idle_threshold": 0.05,
        "busy_threshold": 0.7,
        "retry_seconds": 2,
        "gpm": False,
        "gpm_interval_seconds": 0.25,
        "health_interval_seconds": 300,
    }
    assert gpu(section) == GPUConfig(True, 30.0, 0.5, 60.0, 0.05, 0.7, 2.0, False, 0.25, 300.0)


@pytest.mark.parametrize(
    ("section", "enabled"),
    [
        ({"gpm": False}, False),
        ({"gpm_interval_seconds": 0}, False),
        ({"gpm_interval_seconds": 0.1}, True),
    ],
)
def test_gpm_is_off_with_gpm_false_or_a_zero_interval(
    section: dict[str, object], enabled: bool
) -> None:
    assert gpu(section).gpm_enabled is enabled


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        ({"busy_threshold": 0.15}, "collectors.gpu.busy_threshold", "exceed idle_threshold"),
        ({"idle_threshold": 0.95}, "collectors.gpu.idle_threshold", "<= 0.9"),
        ({"sample_interval_seconds": 20}, "collectors.gpu.sample_interval_seconds", "<= 10"),
        (
            {"window_seconds": 5, "sample_interval_seconds": 3},
            "collectors.gpu.sample_interval_seconds",
            "half of window_seconds",
        ),
        ({"enabled": "yes"}, "collectors.gpu.enabled", "true, false or auto"),
        ({"gpm_interval_seconds": 0.05}, "collectors.gpu.gpm_interval_seconds", "at least 0.1"),
        ({"gpm_interval_seconds": -1}, "collectors.gpu.gpm_interval_seconds", ">= 0"),
        ({"gpm": "on"}, "collectors.gpu.gpm", "true or false"),
        ({"windows": 60}, "collectors.gpu.windows", "unknown key"),
    ],
)
def test_invalid_values_name_their_key(section: dict[str, object], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        gpu(section)
    assert caught.value.path == path
    assert message in caught.value.message
