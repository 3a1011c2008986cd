"""``trainmon serve --demo``: the real node collectors over the simulated node's files."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families
from support.daemon import Daemon


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_demo_node_serves_simulated_nic_disk_and_infiniband(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon(args=["--demo"])
    first = daemon.metrics()
    build = samples(first, "trainmon_build_info")
    assert [dict(labels)["mode"] for labels in build] == ["demo"]

    received = samples(first, "trainmon_network_receive_bytes_total")
    assert {dict(labels)["device"] for labels in received} == {"eth0"}  # lo, docker0 excluded
    assert samples(first, "trainmon_network_speed_bytes") == {(("device", "eth0"),): 25e9 / 8}

    reads = samples(first, "trainmon_disk_reads_completed_total")
    assert {dict(labels)["device"] for labels in reads} == {"nvme0n1", "sda"}  # no p1, no loop

    rates = samples(first, "trainmon_infiniband_rate_bytes")
    assert set(rates.values()) == {200e9 / 8}
    assert set(samples(first, "trainmon_infiniband_port_up").values()) == {1.0}

    time.sleep(2.2)
    second = daemon.metrics()
    before = received[(("device", "eth0"),)]
    after = samples(second, "trainmon_network_receive_bytes_total")[(("device", "eth0"),)]
    assert 180e6 * 1.0 < after - before < 180e6 * 4  # ~180 MB/s of dataset traffic
    nvme = (("device", "nvme0n1"),)
    assert samples(second, "trainmon_disk_reads_completed_total")[nvme] > reads[nvme]
