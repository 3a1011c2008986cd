"""``trainmon serve --demo``: the real node collectors over the simulated node's files."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.support.daemon import Daemon
from tests.support.exposition import parse


def test_demo_node_serves_simulated_nic_disk_and_infiniband(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon(args=["--demo"])
    first = parse(daemon.metrics())
    assert [labels["mode"] for labels in first.labelsets("trainmon_build_info")] == ["demo"]

    received = first.by_device("trainmon_network_receive_bytes_total")
    assert set(received) == {"eth0"}  # lo, docker0 excluded
    assert first.by_device("trainmon_network_speed_bytes") == {"eth0": 25e9 / 8}

    reads = first.by_device("trainmon_disk_reads_completed_total")
    assert set(reads) == {"nvme0n1", "sda"}  # no p1, no loop

    rates = first.samples["trainmon_infiniband_rate_bytes"]
    assert set(rates.values()) == {200e9 / 8}
    assert set(first.samples["trainmon_infiniband_port_up"].values()) == {1.0}

    time.sleep(2.2)
    second = parse(daemon.metrics())
    after = second.by_device("trainmon_network_receive_bytes_total")["eth0"]
    assert 180e6 * 1.0 < after - received["eth0"] < 180e6 * 4  # ~180 MB/s of dataset traffic
    assert second.by_device("trainmon_disk_reads_completed_total")["nvme0n1"] > reads["nvme0n1"]
