"""trainmon.node.mountstats on checked-in ``/proc/<pid>/mountstats`` files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trainmon.core.collector import CollectorUnavailable
from trainmon.node.mountstats import (
    MountstatsReader,
    NFSOperation,
    parse_mountstats,
    unescape,
)


def test_only_nfs_mounts_with_their_identity(tree: Callable[[str], Path]) -> None:
    reading = MountstatsReader(tree("mountstats-host") / "proc").read()
    assert reading.path == tree("mountstats-host") / "proc" / "1" / "mountstats"
    assert reading.problems == ()
    identity = [
        (m.mountpoint, m.server, m.export, m.fstype, m.version) for m in reading.mounts
    ]
    assert identity == [
        ("/home", "192.168.1.10", "/export/home", "nfs", "3"),
        ("/mnt/train data", "10.0.0.8", "/cfs-dataset", "nfs4", "4.1"),
        ("/mnt/v6", "[fd00::8]", "/shared", "nfs4", "4.2"),
        ("/srv/over", "10.0.0.9", "/old", "nfs", "3"),
        ("/srv/over", "10.0.0.10", "/new", "nfs4", "4.0"),
    ]


def test_bytes_in_kernel_order(tree: Callable[[str], Path]) -> None:
    mounts = MountstatsReader(tree("mountstats-host") / "proc").read().mounts
    cfs = mounts[1]
    assert dict(cfs.bytes) == {
        "normal_read": 7101, "normal_write": 7102, "direct_read": 7103, "direct_write": 7104,
        "server_read": 7105, "server_write": 7106, "read_pages": 7107, "write_pages": 7108,
    }  # fmt: skip


def test_per_op_statistics_with_and_without_errors_column(tree: Callable[[str], Path]) -> None:
    home, cfs = MountstatsReader(tree("mountstats-host") / "proc").read().mounts[:2]
    assert cfs.operations["READ"] == NFSOperation(
        operations=8001, transmissions=8002, timeouts=8003, bytes_sent=8004,
        bytes_received=8005, queue_seconds=8.006, rtt_seconds=8.007, execute_seconds=8.008,
        errors=8009,
    )  # fmt: skip
    assert home.operations["READDIRPLUS"].rtt_seconds == pytest.approx(2.507)
    assert home.operations["READDIRPLUS"].errors is None  # an older kernel: no errors column
    assert {"NULL", "GETATTR", "LOOKUP", "ACCESS", "READ", "WRITE", "COMMIT"} <= set(
        home.operations
    )
    assert len(home.operations) == 22  # every NFSv3 procedure is listed, used or not
    assert cfs.operations["CREATE_SESSION"].operations == 1


def test_truncated_file_keeps_every_good_line(tree: Callable[[str], Path]) -> None:
    reading = MountstatsReader(tree("mountstats-truncated") / "proc").read()
    cfs, scratch = reading.mounts
    assert cfs.mountpoint == "/mnt/cfs" and set(cfs.operations) == {"READ", "GETATTR"}
    assert cfs.bytes["server_read"] == 7105
    assert scratch.mountpoint == "/mnt/scratch"
    assert scratch.bytes == {}  # the short bytes: line is not half-used
    assert set(scratch.operations) == {"GETATTR"}  # READ was cut off
    assert len(reading.problems) == 2
    assert all(problem.startswith("/mnt/scratch: ") for problem in reading.problems)
    assert "bytes" in reading.problems[0] and "READ: 4101 4102 41" in reading.problems[1]


def test_falls_back_to_self_when_pid_1_is_unreadable(
    tree: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    reader = MountstatsReader(tree("mountstats-fallback") / "proc")
    with caplog.at_level("INFO", logger="trainmon.node.mountstats"):
        first = reader.read()
        second = reader.read()
    assert first.path.parent.name == "self" and second.path == first.path
    assert [m.mountpoint for m in first.mounts] == ["/mnt/cfs"]
    fallback = [r for r in caplog.records if "instead" in r.getMessage()]
    assert len(fallback) == 1  # said once, not on every scrape
    assert "only this process's mount namespace" in fallback[0].getMessage()


def test_no_nfs_mounts_is_an_empty_reading(tree: Callable[[str], Path]) -> None:
    reading = MountstatsReader(tree("mountstats-no-nfs") / "proc").read()
    assert reading.mounts == () and reading.problems == ()


def test_no_mountstats_at_all_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(CollectorUnavailable, match="mountstats does not exist"):
        MountstatsReader(tmp_path / "proc").read()


def test_unescape_kernel_octal_escapes() -> None:
    assert unescape(r"/mnt/a\040b\011c\134d\012") == "/mnt/a b\tc\\d\n"
    assert unescape("/plain") == "/plain"


def test_every_unindented_line_ends_an_nfs_entry() -> None:
    mounts, problems = parse_mountstats(
        "device s:/e mounted on /m with fstype nfs4 statvers=1.1\n"
        "\tper-op statistics\n"
        "\t        READ: 1 1 0 10 20 0 3 4 0\n"
        "no device mounted on /x with fstype autofs\n"
        "device none mounted on /sys/fs/bpf with fstype bpf\n"
    )
    assert problems == []
    assert [(m.mountpoint, set(m.operations)) for m in mounts] == [("/m", {"READ"})]


def test_garbage_never_raises() -> None:
    mounts, problems = parse_mountstats(
        "device broken line\n"
        "device s:/e mounted on /m with fstype nfs\n"
        "\tbytes:\tx y z 1 2 3 4 5\n"
        "\tper-op statistics\n"
        "\t READ: 1 2 3\n"
        "\t lower: 1 2 3 4 5 6 7 8\n"
        "\x00\xff garbage\n"
    )
    assert [m.mountpoint for m in mounts] == ["/m"]
    assert mounts[0].bytes == {} and mounts[0].operations == {}
    assert len(problems) == 5
