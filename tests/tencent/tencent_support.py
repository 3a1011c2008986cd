"""Helpers shared by the Tencent Cloud tests (constants, config, reading output)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from testkit.fake_tencent_api import FakeTencentCloud
from trainmon.collectors.tencent import TencentCollector, TencentConfig
from trainmon.config import parse_config

SECRET_ID = "AKIDtrainmontest0001"
SECRET_KEY = "s3cr3t-KEY-never-shown-0123456789"
#: 2023-11-14T22:13:50Z: an arbitrary, fixed "now" (not on a period boundary).
START = 1_700_000_030.0

Series = tuple[str, frozenset[tuple[str, str]]]


def tencent_config(
    cloud: FakeTencentCloud, environ: Mapping[str, str] | None = None, **keys: Any
) -> TencentConfig:
    """A parsed ``collectors.tencent`` section aimed at the fake; ``None`` drops a key."""
    section: dict[str, Any] = {
        "enabled": True,
        "endpoint": cloud.url,
        "region": "ap-shanghai",
        "secret_id": SECRET_ID,
        "secret_key": "${TEST_TENCENT_SECRET_KEY}",
        "metadata_url": "http://127.0.0.1:9",  # nothing listens on the discard port
    }
    section.update(keys)
    section = {key: value for key, value in section.items() if value is not None}
    env = {"TEST_TENCENT_SECRET_KEY": SECRET_KEY, **(environ or {})}
    return parse_config({"collectors": {"tencent": section}}, env).collectors.tencent


def samples(collector: TencentCollector) -> dict[Series, float]:
    """Every sample of one collect(), keyed by (sample name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in collector.collect()
        for sample in family.samples
    }


def named(output: Mapping[Series, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (sample, labels), value in output.items() if sample == name}


def exposition(collector: TencentCollector) -> str:
    """The Prometheus text format of one scrape of ``collector``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()
