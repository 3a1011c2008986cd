"""Sanity check against this machine's kernel: our readings vs psutil's a moment earlier.

Counters only grow, so every value we export must be at least what psutil read
just before (psutil reads the same /proc files with its own parser).
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from trainmon.collectors.disk import DiskCollector, DiskConfig
from trainmon.collectors.network import NetworkCollector, NetworkConfig

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/diskstats").exists(),
    reason="needs a Linux /proc and /sys",
)


def test_network_counters_are_at_least_psutils(scrape) -> None:
    before = psutil.net_io_counters(pernic=True)
    result = scrape(NetworkCollector(NetworkConfig(), Path("/proc"), Path("/sys")))

    devices = result.by_device("trainmon_network_receive_bytes_total")
    assert devices, "no network interface exported on this machine"
    assert "lo" not in devices
    pairs = {
        "receive_bytes": "bytes_recv",
        "transmit_bytes": "bytes_sent",
        "receive_packets": "packets_recv",
        "transmit_packets": "packets_sent",
        "receive_errors": "errin",
        "transmit_errors": "errout",
        "receive_drops": "dropin",
        "transmit_drops": "dropout",
    }
    compared = 0
    for ours, theirs in pairs.items():
        exported = result.by_device(f"trainmon_network_{ours}_total")
        assert set(exported) == set(devices)
        for device, value in exported.items():
            if device in before:
                assert value >= getattr(before[device], theirs), (device, ours)
                compared += 1
    assert compared >= len(pairs)


def test_disk_counters_are_at_least_psutils(scrape) -> None:
    before = psutil.disk_io_counters(perdisk=True)
    result = scrape(DiskCollector(DiskConfig(), Path("/proc"), Path("/sys")))

    devices = result.by_device("trainmon_disk_reads_completed_total")
    assert devices, "no whole block device exported on this machine"
    assert not any(name.startswith(("loop", "ram", "zram")) for name in devices)
    # psutil: counts, bytes (sectors x 512), milliseconds; ours: counts, bytes, seconds.
    pairs = {
        "reads_completed_total": ("read_count", 1),
        "writes_completed_total": ("write_count", 1),
        "read_bytes_total": ("read_bytes", 1),
        "written_bytes_total": ("write_bytes", 1),
        "read_time_seconds_total": ("read_time", 1000),
        "write_time_seconds_total": ("write_time", 1000),
        "io_time_seconds_total": ("busy_time", 1000),
    }
    compared = 0
    for ours, (theirs, scale) in pairs.items():
        for device, value in result.by_device(f"trainmon_disk_{ours}").items():
            if device in before:
                assert round(value * scale) >= getattr(before[device], theirs), (device, ours)
                compared += 1
    assert compared >= len(pairs)
