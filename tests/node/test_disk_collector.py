"""DiskCollector on checked-in /proc/diskstats and sysfs block trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmon.collectors.disk import DiskCollector, DiskConfig
from trainmon.config import parse_config
from trainmon.core.collector import CollectorUnavailable

BASE_COUNTERS = [
    "reads_completed", "writes_completed", "read_bytes", "written_bytes",
    "read_time_seconds", "write_time_seconds", "io_time_seconds", "io_time_weighted_seconds",
]  # fmt: skip
DISCARD_COUNTERS = ["discards_completed", "discarded_bytes"]


def collector(root: Path, config: DiskConfig | None = None) -> DiskCollector:
    return DiskCollector(config or DiskConfig(), root / "proc", root / "sys")


def expected_types(*counters: str) -> dict[str, str]:
    return {
        **{f"trainmon_disk_{name}_total": "counter" for name in counters},
        "trainmon_disk_io_now": "gauge",
    }


def device_values(fields: list[int]) -> dict[str, float]:
    """What one diskstats line (the numbers after the name) must export, by metric."""
    values = {
        "reads_completed_total": fields[0],
        "read_bytes_total": fields[2] * 512,
        "read_time_seconds_total": fields[3] / 1000,
        "writes_completed_total": fields[4],
        "written_bytes_total": fields[6] * 512,
        "write_time_seconds_total": fields[7] / 1000,
        "io_now": fields[8],
        "io_time_seconds_total": fields[9] / 1000,
        "io_time_weighted_seconds_total": fields[10] / 1000,
    }
    if len(fields) >= 15:
        values["discards_completed_total"] = fields[11]
        values["discarded_bytes_total"] = fields[13] * 512
    if len(fields) >= 17:
        values["flush_requests_total"] = fields[15]
    return values


def assert_devices(result, expected: dict[str, list[int]]) -> None:
    """Every exported disk metric holds exactly the values of ``expected``'s lines."""
    by_metric: dict[str, dict[str, float]] = {}
    for device, fields in expected.items():
        for metric, value in device_values(fields).items():
            by_metric.setdefault(f"trainmon_disk_{metric}", {})[device] = value
    exported = {name: result.by_device(name) for name in result.samples}
    assert exported == by_metric


def test_20_field_format_whole_disks_only(tree, scrape) -> None:
    result = scrape(collector(tree("kernel-5.15")))

    assert result.types == expected_types(*BASE_COUNTERS, *DISCARD_COUNTERS, "flush_requests")
    # loop0, ram0, zram0 and the partitions sda1, sda2, nvme0n1p1 are not exported.
    assert_devices(
        result,
        {
            "dm-0": [1500, 0, 12000, 30, 2500, 0, 20000, 50, 0, 70, 80, 0, 0, 0, 0, 0, 0],
            "nvme0n1": [
                2868393, 1021, 463742634, 1436592, 9812341, 5123, 1198234512, 7123456, 4,
                3276543, 8765432, 51234, 0, 98765432, 12345, 412345, 6789,
            ],
            "sda": list(range(101, 118)),
        },
    )  # fmt: skip
    # nvme0n1 has 4096-byte sectors in sysfs; diskstats sectors are 512 bytes regardless.
    assert result.by_device("trainmon_disk_read_bytes_total")["nvme0n1"] == 237436228608
    assert result.by_device("trainmon_disk_read_time_seconds_total")["nvme0n1"] == 1436.592
    assert result.by_device("trainmon_disk_flush_requests_total") == {
        "dm-0": 0,
        "nvme0n1": 412345,
        "sda": 116,
    }


def test_18_field_format_has_discards_but_no_flushes(tree, scrape) -> None:
    result = scrape(collector(tree("kernel-4.19")))

    assert result.types == expected_types(*BASE_COUNTERS, *DISCARD_COUNTERS)
    assert_devices(
        result,
        {
            "md0": [700, 0, 5600, 0, 800, 0, 6400, 0, 0, 0, 0, 0, 0, 0, 0],
            "sr0": [12, 0, 96, 5, 0, 0, 0, 0, 0, 5, 5, 0, 0, 0, 0],
            "vda": [40000, 100, 3200000, 25000, 60000, 200, 9600000, 90000, 2, 70000, 115000,
                    500, 0, 800000, 300],
            "vdb": [4294967000, 0, 8, 4294967290, 0, 0, 0, 0, 0, 4294967295, 4294967295,
                    0, 0, 0, 0],
        },
    )  # fmt: skip
    assert result.by_device("trainmon_disk_discarded_bytes_total")["vda"] == 409600000


def test_14_field_format_with_only_class_block_in_sysfs(tree, scrape) -> None:
    result = scrape(collector(tree("kernel-4.4")))

    assert result.types == expected_types(*BASE_COUNTERS)
    # sda1 has a "partition" file, loop0 is dropped by the built-in rule.
    assert_devices(result, {"sda": list(range(9001, 9012)), "sdb": list(range(7001, 7012))})
    assert result.by_device("trainmon_disk_io_time_seconds_total") == {"sda": 9.01, "sdb": 7.01}


def test_2_6_partition_lines_are_skipped_and_cciss_names_kept(tree, scrape) -> None:
    result = scrape(collector(tree("kernel-2.6")))

    assert result.types == expected_types(*BASE_COUNTERS)
    assert_devices(
        result,
        {
            "cciss/c0d0": list(range(6001, 6012)),
            "sda": [51234, 1234, 2345678, 345678, 12345, 23456, 345678, 456789, 0, 234567, 802467],
        },
    )


def test_include_and_exclude_come_from_the_config_file(tree, scrape) -> None:
    config = parse_config(
        {"collectors": {"disk": {"include": "^(sd|nvme|loop)", "exclude": "^nvme"}}}
    ).collectors.disk

    result = scrape(collector(tree("kernel-5.15"), config))

    # loop0 matches include but stays dropped by the built-in rule; sda1/sda2 are partitions.
    assert result.by_device("trainmon_disk_reads_completed_total") == {"sda": 101}
    assert result.by_device("trainmon_disk_io_now") == {"sda": 109}


def test_filter_that_matches_nothing_exports_nothing(tree, scrape) -> None:
    config = parse_config({"collectors": {"disk": {"include": "^xvd"}}}).collectors.disk

    assert scrape(collector(tree("kernel-5.15"), config)).text == ""


def test_32_bit_counter_wrap_stays_monotonic(writable_tree, scrape) -> None:
    root = writable_tree("kernel-4.19")
    disk = collector(root)
    first = scrape(disk)
    assert first.by_device("trainmon_disk_reads_completed_total")["vdb"] == 4294967000

    diskstats = root / "proc" / "diskstats"
    # vdb wrapped: reads 4294967000 -> 100, read ms 4294967290 -> 10, busy ms 4294967295 -> 5.
    diskstats.write_text(
        " 252      16 vdb 100 0 16 10 1 0 8 1 1 5 7 0 0 0 0\n"
        " 252       0 vda 40001 100 3200008 25001 60000 200 9600000 90000 0 70001 115001"
        " 500 0 800000 300\n"
    )
    result = scrape(disk)

    assert result.by_device("trainmon_disk_reads_completed_total") == {
        "vda": 40001,
        "vdb": 2**32 + 100,
    }
    assert result.by_device("trainmon_disk_read_time_seconds_total") == {
        "vda": 25.001,
        "vdb": (2**32 + 10) / 1000,
    }
    assert result.by_device("trainmon_disk_io_time_seconds_total")["vdb"] == (2**32 + 5) / 1000
    assert result.by_device("trainmon_disk_io_time_weighted_seconds_total")["vdb"] == (
        (2**32 + 7) / 1000
    )
    # Not wrapped: went up from 8 sectors; the in-flight gauge is never corrected.
    assert result.by_device("trainmon_disk_read_bytes_total")["vdb"] == 16 * 512
    assert result.by_device("trainmon_disk_io_now")["vdb"] == 1
    # md0 and sr0 vanished from the file, so from the output.
    assert set(result.by_device("trainmon_disk_io_now")) == {"vda", "vdb"}


def test_missing_diskstats_means_unavailable(tmp_path: Path) -> None:
    (tmp_path / "sys" / "block").mkdir(parents=True)

    with pytest.raises(CollectorUnavailable, match="diskstats"):
        list(collector(tmp_path).collect())


def test_without_block_sysfs_partitions_cannot_be_told_apart(tree, tmp_path: Path) -> None:
    disk = DiskCollector(DiskConfig(), tree("kernel-5.15") / "proc", tmp_path)

    with pytest.raises(CollectorUnavailable, match="partitions"):
        list(disk.collect())


def test_help_names_the_source_and_unit(tree, scrape) -> None:
    text = scrape(collector(tree("kernel-5.15"))).text

    assert (
        "# HELP trainmon_disk_read_bytes_total Bytes read (sectors read x 512) on the whole "
        "block device, cumulative (/proc/diskstats field 3)."
    ) in text
