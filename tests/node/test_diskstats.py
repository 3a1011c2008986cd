"""``trainmon.node.diskstats``: whole disks of /proc/diskstats, in base units."""

from __future__ import annotations

from trainmon.node.diskstats import SECTOR_BYTES, DiskReading, DiskstatsReader, parse_diskstats


def test_readings_are_whole_disks_in_bytes_and_seconds(tree) -> None:
    root = tree("kernel-4.4")  # 14-field lines; sysfs with class/block only

    readings = DiskstatsReader(root / "proc", root / "sys").read()

    assert [reading.device for reading in readings] == ["sda", "sdb"]  # no sda1, no loop0
    assert readings[0] == DiskReading(
        device="sda",
        counters={
            "reads_completed": 9001,
            "writes_completed": 9005,
            "read_bytes": 9003 * SECTOR_BYTES,
            "written_bytes": 9007 * SECTOR_BYTES,
            "read_time_seconds": 9.004,
            "write_time_seconds": 9.008,
            "io_time_seconds": 9.010,
            "io_time_weighted_seconds": 9.011,
        },
        io_in_flight=9009,
    )


def test_configured_filter_applies_after_the_builtin_exclude(tree) -> None:
    root = tree("kernel-5.15")

    readings = DiskstatsReader(root / "proc", root / "sys", lambda device: device != "sda").read()

    assert [reading.device for reading in readings] == ["dm-0", "nvme0n1"]
    assert readings[1].counters["flush_requests"] == 412345
    assert readings[1].counters["discarded_bytes"] == 98765432 * SECTOR_BYTES


def test_parse_converts_only_the_devices_kept() -> None:
    text = (
        "   7       0 loop0 1 2 3 4 5 6 7 8 9 10 11\n"
        "   8       0 sda 1 2 3 4 5 6 7 8 9 10 11\n"
        "   8       1 sda1 x y z 4 5 6 7 8 9 10 11\n"  # malformed, but not kept
    )
    assert parse_diskstats(text, keep=lambda device: device == "sda") == {
        "sda": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}
    assert set(parse_diskstats(text)) == {"loop0", "sda"}
