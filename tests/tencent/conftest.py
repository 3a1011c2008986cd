"""Fixtures for the Tencent Cloud puller: a fake API on loopback and a shared clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from testkit.fake_tencent_api import FakeClock, FakeTencentCloud
from tests.tencent.tencent_support import SECRET_ID, SECRET_KEY, START, tencent_config
from trainmon.collectors.tencent import TencentCollector


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def cloud(clock: FakeClock) -> Iterator[FakeTencentCloud]:
    with FakeTencentCloud(clock) as fake:
        fake.add_account(SECRET_ID, SECRET_KEY)
        yield fake


@pytest.fixture
def make_collector(
    cloud: FakeTencentCloud, clock: FakeClock
) -> Iterator[Callable[..., TencentCollector]]:
    """``make_collector(environ=..., refresh_interval=..., **config keys)``."""
    made: list[TencentCollector] = []

    def make(
        environ: Mapping[str, str] | None = None,
        refresh_interval: float | None = None,
        **keys: Any,
    ) -> TencentCollector:
        collector = TencentCollector(
            tencent_config(cloud, environ, **keys),
            environ=dict(environ or {}),
            clock=clock,
            refresh_interval=refresh_interval,
            align=refresh_interval is None,
        )
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.stop()
