"""``trainmon serve --demo``: the real node collectors over the simulated node's files."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.support.daemon import Daemon
from tests.support.exposition import parse
from trainmon.demo.node import SimulatedNodeFiles


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


def test_demo_node_serves_numa_locality_and_cfs_statistics(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon(args=["--demo"])
    first = parse(daemon.metrics())
    assert first.by_gpu("trainmon_gpu_numa_node") == {
        str(gpu): 0.0 if gpu < 4 else 1.0 for gpu in range(8)
    }
    ratios = first.series("trainmon_gpu_process_numa_local_ratio", "gpu", "pid")
    # the starved job's process on GPU 3 is bound to the far socket; every other one is local
    assert ratios == {(str(gpu), str(41000 + gpu)): 0.0 if gpu == 3 else 1.0 for gpu in range(8)}
    assert first.labelsets("trainmon_nfs_mount_info") == [{
        "mountpoint": "/mnt/cfs", "server": "10.0.0.8", "export": "/cfs-dataset",
        "fstype": "nfs4", "version": "4.0",
    }]  # fmt: skip
    operations = first.series("trainmon_nfs_operations_total", "mountpoint", "operation")
    assert {op for _, op in operations} == {"READ", "GETATTR", "LOOKUP", "ACCESS", "OPEN", "CLOSE"}
    read = first.value("trainmon_nfs_read_bytes_total", mountpoint="/mnt/cfs")
    received = first.by_device("trainmon_network_receive_bytes_total")["eth0"]
    assert read is not None and 0.95 < read / received < 1.05  # the dataset is eth0's traffic
    mean_rtt = first.value(
        "trainmon_nfs_operation_rtt_seconds_total", mountpoint="/mnt/cfs", operation="READ"
    ) / operations[("/mnt/cfs", "READ")]
    assert 0.001 < mean_rtt < 0.02  # milliseconds, as a loaded CFS answers 1 MiB reads

    time.sleep(2.2)
    second = parse(daemon.metrics())
    after = second.value("trainmon_nfs_read_bytes_total", mountpoint="/mnt/cfs")
    assert after is not None and 180e6 * 1.0 < after - read < 180e6 * 4


def test_demo_tree_mounts_for_the_checkpoint_classification(tmp_path: Path) -> None:
    files = SimulatedNodeFiles(root=tmp_path)
    mountinfo = (files.proc_root / "1" / "mountinfo").read_text().splitlines()
    mounts = {
        line.split()[4]: (line.split()[2], *line.split(" - ")[1].split()[:2]) for line in mountinfo
    }
    assert mounts == {
        "/": ("8:0", "ext4", "/dev/sda"),
        "/data": ("259:1", "xfs", "/dev/nvme0n1p1"),
        "/mnt/cfs": ("0:52", "nfs4", "10.0.0.8:/cfs-dataset"),
        "/dev/shm": ("0:23", "tmpfs", "tmpfs"),
    }
    for number, name in (("8:0", "sda"), ("259:1", "nvme0n1p1")):
        entry = files.sys_root / "dev" / "block" / number
        assert entry.is_symlink() and entry.resolve() == (files.sys_root / "class" / "block" / name)
        assert not (entry / "serial").exists()  # sda is the demo's system disk, no cloud serial
    SimulatedNodeFiles(root=tmp_path)  # rebuilding over an existing tree keeps it valid
    assert (files.sys_root / "dev" / "block" / "8:0").resolve().name == "sda"
