"""The wall clock steps an hour forward or back after an XID: the XID stays recent (its
recovery action stands) for ``XID_LOOKBACK_SECONDS`` on the monotonic clock, and the wall
clock less its exported timestamp stays its age (docs/architecture.md, "Clocks")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import Scrape
from tests.gpu.gpu_support import Clock, FakeNVML, start_listening, wait_for
from trainmon.collectors.gpu import GPUCollector, GPUConfig
from trainmon.gpu import recovery
from trainmon.gpu.nvml import NVML

HOUR = 3600.0


@pytest.mark.parametrize("jump", [HOUR, -HOUR], ids=["forward", "back"])
def test_an_xid_is_recent_for_the_lookback_on_the_monotonic_clock(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    clock: Clock,
    scrape: Callable[..., Scrape],
    jump: float,
) -> None:
    scenario("gpus 1\nunsupported_field 0 230\nxid 0 2 79\n")  # the XID table decides
    fake_nvml.set_time(1.0)
    wall = Clock()
    wall.now = 1_700_000_000.0
    collector = GPUCollector(NVML(clock=clock), GPUConfig(), clock=clock, wall_clock=wall)

    def advance(seconds: float) -> None:
        clock.now += seconds
        wall.now += seconds

    try:
        start_listening(collector)
        fake_nvml.set_time(3.0)
        wait_for(lambda: len(collector.xid.counts()) == 1)
        advance(60.0)
        wall.now += jump
        result = scrape(collector)
        assert result.series("trainmon_gpu_recovery_action", "gpu", "action", "source") == {
            ("0", "reboot", "xid_table"): 1.0}
        assert wall.now - result.value("trainmon_gpu_xid_last_timestamp_seconds",
                                       gpu="0", xid="79") == pytest.approx(60.0)
        advance(recovery.XID_LOOKBACK_SECONDS)
        assert scrape(collector).series("trainmon_gpu_recovery_action", "gpu", "action",
                                        "source") == {("0", "none", "none"): 1.0}
    finally:
        collector.stop()
