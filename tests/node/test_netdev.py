"""``trainmon.node.netdev``: the typed readings of /proc/net/dev and sysfs speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmon.core.collector import CollectorUnavailable
from trainmon.node.netdev import InterfaceReading, NetDevReader, parse_net_dev


def test_readings_are_sorted_filtered_and_give_speed_in_bytes(tree) -> None:
    root = tree("kernel-5.15")
    reader = NetDevReader(root / "proc", root / "sys", lambda device: device.startswith("eth"))

    assert reader.read() == [
        InterfaceReading(
            device="eth0",
            counters={
                "receive_bytes": 123456789012, "receive_packets": 98765432,
                "receive_errors": 3, "receive_drops": 5,
                "transmit_bytes": 98765432109, "transmit_packets": 87654321,
                "transmit_errors": 7, "transmit_drops": 11,
            },
            speed_bytes=25000 * 125_000,
        ),
        InterfaceReading(
            device="eth1",
            counters=dict.fromkeys(
                ["receive_bytes", "receive_packets", "receive_errors", "receive_drops",
                 "transmit_bytes", "transmit_packets", "transmit_errors", "transmit_drops"], 0,
            ),
            speed_bytes=None,  # "-1": link down
        ),
    ]  # fmt: skip


def test_parse_takes_names_up_to_the_colon_even_without_a_space(tree) -> None:
    """What ``diagnosis.nccl`` relies on to list a process's interfaces."""
    text = (tree("kernel-2.6") / "proc" / "net" / "dev").read_text()

    devices = parse_net_dev(text)

    assert list(devices) == ["lo", "eth0", "eth1"]
    assert devices["eth0"]["receive_bytes"] == 1957258311
    assert devices["eth1"]["transmit_drops"] == 4


def test_header_without_a_column_leaves_its_counter_out(tree) -> None:
    text = (tree("kernel-2.2") / "proc" / "net" / "dev").read_text()

    counters = parse_net_dev(text)["eth0"]

    assert "receive_bytes" not in counters and "transmit_bytes" not in counters
    assert counters["receive_packets"] == 123456


def test_missing_net_dev_makes_the_source_unavailable(tmp_path: Path) -> None:
    with pytest.raises(CollectorUnavailable, match="net/dev does not exist"):
        NetDevReader(tmp_path / "proc", tmp_path / "sys").read()


def test_speed_follows_interfaces_that_come_go_and_change(writable_tree) -> None:
    root = writable_tree("kernel-5.15")
    reader = NetDevReader(root / "proc", root / "sys", lambda device: device.startswith("eth"))
    net_dev = root / "proc" / "net" / "dev"
    original = net_dev.read_text()
    assert {r.device: r.speed_bytes for r in reader.read()} == {
        "eth0": 25000 * 125_000, "eth1": None}
    (root / "sys" / "class" / "net" / "eth0" / "speed").write_text("100000\n")
    net_dev.write_text(original.replace("eth1:", "eth9:"))  # eth1 gone, eth9 new
    (root / "sys" / "class" / "net" / "eth9").mkdir()
    (root / "sys" / "class" / "net" / "eth9" / "speed").write_text("10000\n")
    assert {r.device: r.speed_bytes for r in reader.read()} == {
        "eth0": 100000 * 125_000, "eth9": 10000 * 125_000}
    net_dev.write_text(original)
    assert {r.device: r.speed_bytes for r in reader.read()} == {
        "eth0": 100000 * 125_000, "eth1": None}
