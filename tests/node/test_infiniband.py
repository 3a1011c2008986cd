"""``trainmon.node.infiniband``: the typed readings of /sys/class/infiniband ports."""

from __future__ import annotations

from pathlib import Path

from trainmon.node.infiniband import InfinibandReader, port_active


def test_port_readings_prefer_counters_ext_and_convert_words_and_rate(tree) -> None:
    ports = InfinibandReader(tree("kernel-5.15") / "sys").read()

    assert [(port.device, port.port, port.link_layer) for port in ports] == [
        ("mlx5_0", "1", "InfiniBand"),
        ("mlx5_0", "2", "InfiniBand"),
        ("mlx5_1", "1", "Ethernet"),
    ]
    active, down, _ = ports
    assert active.traffic["receive_bytes"] == 1234567890123 * 4
    assert active.traffic["receive_packets"] == 5555555555
    assert active.rate_bytes == 12_500_000_000
    assert active.active is True
    assert down.active is False
    assert down.traffic["receive_bytes"] == 4294967295 * 4  # saturated, exported raw
    assert "vl15_dropped" not in down.errors  # unreadable file
    assert "vl15_dropped" in active.errors


def test_host_without_infiniband_has_no_ports(tmp_path: Path) -> None:
    assert InfinibandReader(tmp_path).read() == []


def test_only_the_active_state_is_active() -> None:
    assert port_active("4: ACTIVE")
    assert not port_active("1: DOWN")
    assert not port_active("")
