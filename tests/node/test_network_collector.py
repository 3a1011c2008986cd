"""NetworkCollector on checked-in /proc/net/dev and /sys/class/net trees."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trainmon.collectors.network import NetworkCollector, NetworkConfig
from trainmon.config import parse_config
from trainmon.core.collector import CollectorUnavailable

COUNTER_NAMES = [
    f"trainmon_network_{direction}_{kind}_total"
    for direction in ("receive", "transmit")
    for kind in ("bytes", "packets", "errors", "drops")
]
HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|"
    "bytes    packets errs drop fifo colls carrier compressed\n"
)


def collector(root: Path, config: NetworkConfig | None = None) -> NetworkCollector:
    return NetworkCollector(config or NetworkConfig(), root / "proc", root / "sys")


def write_net_dev(
    root: Path, rows: dict[str, tuple[int, int, int, int, int, int, int, int]]
) -> None:
    """Rewrite ``/proc/net/dev``; a row is rx bytes/packets/errs/drop, tx bytes/packets/errs/drop."""
    lines = [HEADER]
    for name, (rb, rp, re_, rd, tb, tp, te, td) in rows.items():
        lines.append(f"{name:>6}: {rb} {rp} {re_} {rd} 0 0 0 0 {tb} {tp} {te} {td} 0 0 0 0\n")
    (root / "proc" / "net" / "dev").write_text("".join(lines))


def test_modern_layout_gives_exact_counters_and_speed(tree, scrape) -> None:
    result = scrape(collector(tree("kernel-5.15")))

    assert result.types == {
        **dict.fromkeys(COUNTER_NAMES, "counter"),
        "trainmon_network_speed_bytes": "gauge",
    }
    expected = {
        # device:    rx bytes, packets, errs, drop, tx bytes, packets, errs, drop
        "eth0": (123456789012, 98765432, 3, 5, 98765432109, 87654321, 7, 11),
        "eth1": (0, 0, 0, 0, 0, 0, 0, 0),
        "bond0.100": (5000000000, 4000000, 21, 22, 6000000000, 5000000, 23, 24),
        "ib0": (77777777, 666666, 0, 1, 88888888, 555555, 0, 2),
    }
    for index, name in enumerate(COUNTER_NAMES):
        assert result.by_device(name) == {dev: row[index] for dev, row in expected.items()}, name
    # eth1 "-1" (link down), bond0.100 unreadable, ib0 without a speed file: omitted.
    assert result.by_device("trainmon_network_speed_bytes") == {"eth0": 25000 * 125000}


def test_default_exclude_drops_loopback_and_container_interfaces(tree, scrape) -> None:
    result = scrape(collector(tree("kernel-4.19")))

    for name in COUNTER_NAMES:
        assert set(result.by_device(name)) == {"ens3"}, name
    assert result.by_device("trainmon_network_receive_bytes_total") == {"ens3": 4294967000}
    assert result.by_device("trainmon_network_speed_bytes") == {"ens3": 1_250_000_000}


def test_include_and_exclude_come_from_the_config_file(tree, scrape) -> None:
    config = parse_config(
        {"collectors": {"network": {"include": "^(eth|bond)", "exclude": r"\.100$"}}}
    ).collectors.network

    result = scrape(collector(tree("kernel-5.15"), config))

    assert result.by_device("trainmon_network_transmit_bytes_total") == {
        "eth0": 98765432109,
        "eth1": 0,
    }


def test_exclude_null_keeps_every_interface(tree, scrape) -> None:
    config = parse_config({"collectors": {"network": {"exclude": None}}}).collectors.network

    result = scrape(collector(tree("kernel-5.15"), config))

    assert set(result.by_device("trainmon_network_receive_packets_total")) == {
        "lo",
        "eth0",
        "eth1",
        "bond0.100",
        "ib0",
        "docker0",
        "veth1a2b3c",
    }
    assert result.by_device("trainmon_network_speed_bytes") == {
        "eth0": 3_125_000_000,
        "veth1a2b3c": 1_250_000_000,
    }


def test_rows_without_space_after_the_colon(tree, scrape) -> None:
    result = scrape(collector(tree("kernel-2.6")))

    assert result.by_device("trainmon_network_receive_bytes_total") == {
        "eth0": 1957258311,
        "eth1": 12345678901,
    }
    assert result.by_device("trainmon_network_receive_packets_total") == {
        "eth0": 2733716,
        "eth1": 2733716,
    }
    assert result.by_device("trainmon_network_transmit_drops_total") == {"eth0": 0, "eth1": 4}
    # eth0 reports 4294967295 (unknown, printed with %u by 3.x kernels).
    assert result.by_device("trainmon_network_speed_bytes") == {"eth1": 125_000_000}


def test_header_without_byte_columns_omits_only_the_byte_counters(tree, scrape) -> None:
    result = scrape(collector(tree("kernel-2.2")))

    assert "trainmon_network_receive_bytes_total" not in result.types
    assert "trainmon_network_transmit_bytes_total" not in result.types
    assert "trainmon_network_speed_bytes" not in result.types
    assert result.by_device("trainmon_network_receive_packets_total") == {"eth0": 123456}
    assert result.by_device("trainmon_network_receive_errors_total") == {"eth0": 2}
    assert result.by_device("trainmon_network_receive_drops_total") == {"eth0": 3}
    assert result.by_device("trainmon_network_transmit_packets_total") == {"eth0": 654321}
    assert result.by_device("trainmon_network_transmit_errors_total") == {"eth0": 4}
    assert result.by_device("trainmon_network_transmit_drops_total") == {"eth0": 5}


def test_unreadable_speed_is_logged_once_at_debug(tree, scrape, caplog) -> None:
    network = collector(tree("kernel-5.15"))
    with caplog.at_level(logging.DEBUG, logger="trainmon.node.netdev"):
        scrape(network)
        scrape(network)

    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1, messages
    assert "bond0.100/speed" in messages[0]
    assert caplog.records[0].levelno == logging.DEBUG


def test_32_bit_counter_wrap_stays_monotonic(writable_tree, scrape) -> None:
    root = writable_tree("kernel-4.19")
    network = collector(root)
    assert scrape(network).by_device("trainmon_network_receive_bytes_total") == {"ens3": 4294967000}

    write_net_dev(root, {"ens3": (200, 3000001, 1, 2, 100, 2000001, 3, 4)})
    wrapped = scrape(network)
    write_net_dev(root, {"ens3": (900, 3000002, 1, 2, 500, 2000002, 3, 4)})
    later = scrape(network)

    assert wrapped.by_device("trainmon_network_receive_bytes_total") == {"ens3": 2**32 + 200}
    assert wrapped.by_device("trainmon_network_transmit_bytes_total") == {"ens3": 2**32 + 100}
    assert later.by_device("trainmon_network_receive_bytes_total") == {"ens3": 2**32 + 900}
    assert later.by_device("trainmon_network_transmit_bytes_total") == {"ens3": 2**32 + 500}
    assert later.by_device("trainmon_network_receive_packets_total") == {"ens3": 3000002}


def test_a_second_wrap_adds_another_2_pow_32(writable_tree, scrape) -> None:
    root = writable_tree("kernel-4.19")
    network = collector(root)
    scrape(network)  # ens3 receive bytes 4294967000

    for received in (200, 4294967200, 100):
        write_net_dev(root, {"ens3": (received, 1, 0, 0, 1, 1, 0, 0)})
        result = scrape(network)

    assert result.by_device("trainmon_network_receive_bytes_total") == {"ens3": 2 * 2**32 + 100}


def test_backwards_jump_from_above_2_pow_32_after_a_wrap_drops_the_offset(
    writable_tree, scrape
) -> None:
    root = writable_tree("kernel-4.19")
    network = collector(root)
    scrape(network)  # ens3 receive bytes 4294967000
    write_net_dev(root, {"ens3": (200, 1, 0, 0, 1, 1, 0, 0)})
    assert scrape(network).by_device("trainmon_network_receive_bytes_total") == {
        "ens3": 2**32 + 200
    }
    # The raw counter now exceeds 32 bits: it is a 64-bit counter, so the next
    # backwards jump is a reset and the raw value is exported as is.
    write_net_dev(root, {"ens3": (5_000_000_000, 1, 0, 0, 1, 1, 0, 0)})
    scrape(network)
    write_net_dev(root, {"ens3": (7, 1, 0, 0, 1, 1, 0, 0)})

    assert scrape(network).by_device("trainmon_network_receive_bytes_total") == {"ens3": 7}


def test_backwards_jump_of_a_64_bit_counter_is_a_reset(writable_tree, scrape) -> None:
    root = writable_tree("kernel-5.15")
    network = collector(root)
    scrape(network)

    write_net_dev(root, {"eth0": (1000, 10, 0, 0, 2000, 20, 0, 0)})

    result = scrape(network)
    assert result.by_device("trainmon_network_receive_bytes_total") == {"eth0": 1000}
    assert result.by_device("trainmon_network_transmit_bytes_total") == {"eth0": 2000}


def test_an_interface_that_disappears_is_forgotten(writable_tree, scrape) -> None:
    root = writable_tree("kernel-4.19")
    network = collector(root)
    scrape(network)
    write_net_dev(root, {"ens3": (10, 1, 0, 0, 10, 1, 0, 0)})
    assert scrape(network).by_device("trainmon_network_receive_bytes_total") == {"ens3": 2**32 + 10}

    write_net_dev(root, {"eth9": (1, 1, 0, 0, 1, 1, 0, 0)})
    assert set(scrape(network).by_device("trainmon_network_receive_bytes_total")) == {"eth9"}
    write_net_dev(root, {"ens3": (5, 1, 0, 0, 5, 1, 0, 0)})

    # A re-created ens3 starts afresh (a counter reset), without the old wrap offset.
    assert scrape(network).by_device("trainmon_network_receive_bytes_total") == {"ens3": 5}


def test_missing_proc_net_dev_means_unavailable(tmp_path: Path) -> None:
    network = collector(tmp_path)

    with pytest.raises(CollectorUnavailable, match="net/dev"):
        list(network.collect())


def test_help_names_the_source_and_unit(tree, scrape) -> None:
    text = scrape(collector(tree("kernel-5.15"))).text

    assert (
        "# HELP trainmon_network_receive_bytes_total Bytes received on the interface, "
        "cumulative since it appeared (/proc/net/dev, receive column bytes)."
    ) in text
    assert (
        "# HELP trainmon_network_speed_bytes Link speed of the network interface in bytes "
        "per second" in text
    )
