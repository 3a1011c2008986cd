"""NFSCollector on checked-in mountstats files: the exposition Prometheus receives."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import Scrape
from trainmon.collectors.nfs import NFSCollector, NFSConfig
from trainmon.config import parse_config
from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.core.registry import CollectorRegistry

FAMILIES = {
    "trainmon_nfs_mount_info": "gauge",
    "trainmon_nfs_read_bytes_total": "counter",
    "trainmon_nfs_write_bytes_total": "counter",
    "trainmon_nfs_operations_total": "counter",
    "trainmon_nfs_operation_rtt_seconds_total": "counter",
    "trainmon_nfs_operation_execute_seconds_total": "counter",
}


def collector(root: Path, config: NFSConfig | None = None) -> NFSCollector:
    return NFSCollector(config or NFSConfig(), root / "proc")


def test_exports_every_nfs_mount(
    tree: Callable[[str], Path], scrape: Callable[[Collector], Scrape]
) -> None:
    result = scrape(collector(tree("mountstats-host")))
    assert {name: kind for name, kind in result.types.items() if "nfs" in name} == FAMILIES
    assert result.series(
        "trainmon_nfs_mount_info", "mountpoint", "server", "export", "fstype", "version"
    ) == {
        ("/home", "192.168.1.10", "/export/home", "nfs", "3"): 1.0,
        ("/mnt/train data", "10.0.0.8", "/cfs-dataset", "nfs4", "4.1"): 1.0,
        ("/mnt/v6", "[fd00::8]", "/shared", "nfs4", "4.2"): 1.0,
        ("/srv/over", "10.0.0.10", "/new", "nfs4", "4.0"): 1.0,  # the entry mounted over
    }
    # server bytes: what crossed the wire (bytes: fields 5 and 6)
    assert result.series("trainmon_nfs_read_bytes_total", "mountpoint") == {
        ("/home",): 1105, ("/mnt/train data",): 7105, ("/mnt/v6",): 9105, ("/srv/over",): 25,
    }  # fmt: skip
    assert result.value("trainmon_nfs_write_bytes_total", mountpoint="/mnt/train data") == 7106


def test_per_operation_counters_in_seconds(
    tree: Callable[[str], Path], scrape: Callable[[Collector], Scrape]
) -> None:
    result = scrape(collector(tree("mountstats-host")))
    cfs = {"mountpoint": "/mnt/train data"}
    assert result.value("trainmon_nfs_operations_total", operation="READ", **cfs) == 8001
    assert result.value(
        "trainmon_nfs_operation_rtt_seconds_total", operation="READ", **cfs
    ) == pytest.approx(8.007)
    assert result.value(
        "trainmon_nfs_operation_execute_seconds_total", operation="GETATTR", **cfs
    ) == pytest.approx(8.508)
    operations = result.series("trainmon_nfs_operations_total", "mountpoint", "operation")
    home = {op for (mount, op) in operations if mount == "/home"}
    # only operations issued at least once, of the 22 NFSv3 procedures listed
    assert home == {
        "GETATTR", "LOOKUP", "ACCESS", "READ", "WRITE", "READDIRPLUS", "FSSTAT", "FSINFO",
        "PATHCONF",
    }  # fmt: skip
    v6 = {op for (mount, op) in operations if mount == "/mnt/v6"}
    assert v6 == {"READ"}
    assert set(result.series("trainmon_nfs_operation_rtt_seconds_total", "mountpoint", "operation")) == set(operations)


def test_mountpoint_filter(tree: Callable[[str], Path], scrape: Callable[[Collector], Scrape]) -> None:
    config = parse_config(
        {"collectors": {"nfs": {"include": "^/mnt/", "exclude": "v6"}}}
    ).collectors.nfs
    result = scrape(collector(tree("mountstats-host"), config))
    assert [labels["mountpoint"] for labels in result.labelsets("trainmon_nfs_mount_info")] == [
        "/mnt/train data"
    ]


def test_truncated_file_exports_the_good_lines_and_logs_once(
    tree: Callable[[str], Path],
    scrape: Callable[[Collector], Scrape],
    caplog: pytest.LogCaptureFixture,
) -> None:
    nfs = collector(tree("mountstats-truncated"))
    with caplog.at_level(logging.WARNING, logger="trainmon.collectors.nfs"):
        result = scrape(nfs)
        scrape(nfs)
    assert len(result.labelsets("trainmon_nfs_mount_info")) == 2
    assert result.series("trainmon_nfs_read_bytes_total", "mountpoint") == {("/mnt/cfs",): 7105}
    assert result.value(
        "trainmon_nfs_operations_total", mountpoint="/mnt/scratch", operation="GETATTR"
    ) == 4001
    assert result.value(
        "trainmon_nfs_operations_total", mountpoint="/mnt/scratch", operation="READ"
    ) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # one line for the mount, not repeated next scrape
    assert "/mnt/scratch" in warnings[0] and "omitted" in warnings[0]
    assert "bytes line" in warnings[0] and "READ: 4101 4102 41" in warnings[0]
    assert nfs.health() == {
        "source": str(tree("mountstats-truncated") / "proc" / "1" / "mountstats"),
        "mounts": 2,
        "unparsed_lines": 2,
    }


def test_host_without_nfs_exports_nothing_and_is_available(
    tree: Callable[[str], Path], scrape: Callable[[Collector], Scrape]
) -> None:
    registry = CollectorRegistry([collector(tree("mountstats-no-nfs"))])
    result = scrape(registry)  # type: ignore[arg-type]
    assert not [name for name in result.types if name.startswith("trainmon_nfs_")]
    assert result.value("trainmon_collector_success", collector="nfs") == 1.0
    assert result.value("trainmon_collector_available", collector="nfs") == 1.0


def test_no_procfs_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(CollectorUnavailable):
        list(collector(tmp_path).collect())


def test_config_rejects_bad_regex() -> None:
    from trainmon.section import ConfigError

    with pytest.raises(ConfigError, match=r"collectors\.nfs\.include"):
        parse_config({"collectors": {"nfs": {"include": "("}}})
    with pytest.raises(ConfigError, match=r"collectors\.nfs"):
        parse_config({"collectors": {"nfs": {"mountpoint": "/mnt"}}})
    assert parse_config({"collectors": {"nfs": {"enabled": False}}}).collectors.nfs.enabled is False
