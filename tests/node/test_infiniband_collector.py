"""InfinibandCollector on checked-in /sys/class/infiniband trees."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from trainmon.collectors.infiniband import InfinibandCollector

PORT1 = ("mlx5_0", "1")  # ACTIVE, EDR, with counters_ext
PORT2 = ("mlx5_0", "2")  # DOWN, legacy counters only, VL15_dropped unreadable
ROCE = ("mlx5_1", "1")  # link layer Ethernet
PORT_LABELS = ("device", "port")

ERROR_LABELS = [
    "symbol", "link_downed", "link_error_recovery", "rcv_errors", "rcv_remote_physical",
    "rcv_switch_relay", "rcv_constraint", "xmit_discards", "xmit_constraint",
    "local_link_integrity", "excessive_buffer_overrun", "vl15_dropped",
]  # fmt: skip


def test_two_ports_and_roce_give_exact_values(tree, scrape) -> None:
    infiniband = InfinibandCollector(tree("kernel-5.15") / "sys")
    result = scrape(infiniband)

    assert result.types == {
        "trainmon_infiniband_receive_bytes_total": "counter",
        "trainmon_infiniband_transmit_bytes_total": "counter",
        "trainmon_infiniband_receive_packets_total": "counter",
        "trainmon_infiniband_transmit_packets_total": "counter",
        "trainmon_infiniband_errors_total": "counter",
        "trainmon_infiniband_rate_bytes": "gauge",
        "trainmon_infiniband_port_up": "gauge",
        "trainmon_infiniband_port_info": "gauge",
    }
    # Data counters are 4-byte words; port 1 prefers counters_ext over its saturated
    # legacy files (4294967295), port 2 has only the legacy, saturated, counter.
    assert result.series("trainmon_infiniband_receive_bytes_total", *PORT_LABELS) == {
        PORT1: 1234567890123 * 4,
        PORT2: 4294967295 * 4,
        ROCE: 25000000000 * 4,
    }
    assert result.series("trainmon_infiniband_transmit_bytes_total", *PORT_LABELS) == {
        PORT1: 987654321098 * 4,
        PORT2: 1000 * 4,
        ROCE: 12500000000 * 4,
    }
    assert result.series("trainmon_infiniband_receive_packets_total", *PORT_LABELS) == {
        PORT1: 5555555555,
        PORT2: 20,
        ROCE: 300000000,
    }
    assert result.series("trainmon_infiniband_transmit_packets_total", *PORT_LABELS) == {
        PORT1: 4444444444,
        PORT2: 30,
        ROCE: 200000000,
    }
    assert result.series("trainmon_infiniband_rate_bytes", *PORT_LABELS) == {
        PORT1: 12_500_000_000,
        PORT2: 5_000_000_000,
        ROCE: 3_125_000_000,
    }
    assert result.series("trainmon_infiniband_port_up", *PORT_LABELS) == {
        PORT1: 1,
        PORT2: 0,
        ROCE: 1,
    }
    assert result.series("trainmon_infiniband_port_info", *PORT_LABELS, "link_layer") == {
        (*PORT1, "InfiniBand"): 1,
        (*PORT2, "InfiniBand"): 1,
        (*ROCE, "Ethernet"): 1,
    }
    errors = result.series("trainmon_infiniband_errors_total", *PORT_LABELS, "counter")
    assert {label: errors[(*PORT1, label)] for label in ERROR_LABELS} == {
        "symbol": 13,
        "link_downed": 1,
        "link_error_recovery": 2,
        "rcv_errors": 7,
        "rcv_remote_physical": 4,
        "rcv_switch_relay": 5,
        "rcv_constraint": 6,
        "xmit_discards": 11,
        "xmit_constraint": 8,
        "local_link_integrity": 9,
        "excessive_buffer_overrun": 10,
        "vl15_dropped": 12,
    }
    # Port 2: saturated 16- and 8-bit counters as read; unreadable VL15_dropped omitted.
    port2 = {key[2]: value for key, value in errors.items() if key[:2] == PORT2}
    assert port2 == {
        **dict.fromkeys(ERROR_LABELS[2:11], 0),
        "symbol": 65535,
        "link_downed": 255,
    }
    assert {key[2]: value for key, value in errors.items() if key[:2] == ROCE} == dict.fromkeys(
        ERROR_LABELS, 0
    )
    assert len(errors) == 12 + 11 + 12
    assert infiniband.health() == {"ports": 3}


def test_host_without_infiniband_exports_nothing_and_logs_nothing(tree, scrape, caplog) -> None:
    infiniband = InfinibandCollector(tree("kernel-4.19") / "sys")
    with caplog.at_level(logging.DEBUG):
        result = scrape(infiniband)
        scrape(infiniband)

    assert result.text == ""
    assert caplog.records == []
    assert infiniband.health() == {"ports": 0}


def test_host_without_sysfs_exports_nothing(tmp_path: Path, scrape) -> None:
    assert scrape(InfinibandCollector(tmp_path / "no-such-sys")).text == ""


def test_unreadable_counter_is_logged_once_at_debug(tree, scrape, caplog) -> None:
    infiniband = InfinibandCollector(tree("kernel-5.15") / "sys")
    with caplog.at_level(logging.DEBUG, logger="trainmon.node.infiniband"):
        for _ in range(3):
            scrape(infiniband)

    assert [record.levelno for record in caplog.records] == [logging.DEBUG]
    assert "mlx5_0/ports/2/counters/VL15_dropped" in caplog.records[0].getMessage()


def test_every_collect_rereads_the_files(writable_tree, scrape) -> None:
    sys_root = writable_tree("kernel-5.15") / "sys"
    infiniband = InfinibandCollector(sys_root)
    scrape(infiniband)
    port1 = sys_root / "class/infiniband/mlx5_0/ports/1"

    (port1 / "state").write_text("1: DOWN\n")
    (port1 / "counters_ext/port_rcv_data_64").write_text("1234567890999\n")
    shutil.rmtree(sys_root / "class/infiniband/mlx5_1")
    result = scrape(infiniband)

    assert result.series("trainmon_infiniband_port_up", *PORT_LABELS) == {PORT1: 0, PORT2: 0}
    assert result.series("trainmon_infiniband_receive_bytes_total", *PORT_LABELS) == {
        PORT1: 1234567890999 * 4,
        PORT2: 4294967295 * 4,
    }
    assert all(
        key[0] == "mlx5_0"
        for key in result.series("trainmon_infiniband_errors_total", *PORT_LABELS, "counter")
    )
    assert infiniband.health() == {"ports": 2}


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        ("2.5 Gb/sec (1X SDR)", 312_500_000),
        ("14 Gb/sec (1X FDR)", 1_750_000_000),
        ("200 Gb/sec (4X HDR)", 25_000_000_000),
        ("400 Gb/sec (4X NDR)", 50_000_000_000),
        ("unknown", None),
        ("", None),
    ],
)
def test_rate_text_to_bytes_per_second(writable_tree, scrape, rate, expected) -> None:
    sys_root = writable_tree("kernel-5.15") / "sys"
    (sys_root / "class/infiniband/mlx5_1/ports/1/rate").write_text(rate + "\n")

    rates = scrape(InfinibandCollector(sys_root)).series(
        "trainmon_infiniband_rate_bytes", *PORT_LABELS
    )

    assert rates.get(ROCE) == expected
    assert rates[PORT1] == 12_500_000_000


def test_required_infiniband_without_ports_is_unavailable(tmp_path: Path) -> None:
    """``enabled: true`` says the node should have HCAs: their absence is reported."""
    from trainmon.core.collector import CollectorUnavailable

    collector = InfinibandCollector(tmp_path, required=True)
    with pytest.raises(CollectorUnavailable, match="no InfiniBand/RoCE ports"):
        list(collector.collect())
