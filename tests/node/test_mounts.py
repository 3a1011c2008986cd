"""``trainmon.node.mounts``: mountinfo parsing, the mount of a path, storage kinds.

Runs on the checked-in tree ``fixtures/mounts`` (its README describes it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainmon.node.mounts import (
    MountResolver,
    PathStorage,
    classify,
    find_mount,
    parse_mountinfo,
    unescape,
)

TREE = Path(__file__).parent / "fixtures" / "mounts"
HOST_TABLE = parse_mountinfo((TREE / "proc" / "1" / "mountinfo").read_text())


def mount_of(path: str) -> str | None:
    mount = find_mount(HOST_TABLE.mounts, path)
    return None if mount is None else mount.mountpoint


def test_parses_every_well_formed_line_and_counts_the_rest() -> None:
    assert len(HOST_TABLE.mounts) == 17
    assert HOST_TABLE.skipped == 2
    cbs = next(mount for mount in HOST_TABLE.mounts if mount.mountpoint == "/mnt/cbs")
    assert (cbs.mount_id, cbs.parent_id, cbs.major, cbs.minor) == (31, 22, 253, 17)
    assert (cbs.fstype, cbs.source, cbs.root) == ("ext4", "/dev/vdb1", "/")


def test_octal_escapes_in_mount_points() -> None:
    assert unescape(r"/mnt/my\040bucket\011tab") == "/mnt/my bucket\ttab"
    assert unescape(r"a\012b\134c") == "a\nb\\c"
    points = {mount.mountpoint for mount in HOST_TABLE.mounts}
    assert "/mnt/my bucket\ttab" in points
    assert "/mnt/back\\slash" in points
    assert mount_of("/mnt/my bucket\ttab/ckpt.pt") == "/mnt/my bucket\ttab"


def test_bind_mount_keeps_its_root() -> None:
    bind = find_mount(HOST_TABLE.mounts, "/srv/run1/step-10.pt")
    assert bind is not None
    assert (bind.mountpoint, bind.root, bind.source) == ("/srv/run1", "/exports/run1",
                                                         "/dev/nvme0n1p1")


@pytest.mark.parametrize(
    ("path", "mountpoint"),
    [
        ("/data/ckpt/step-1.pt", "/data"),
        ("/data", "/data"),
        ("/data2/ckpt.pt", "/data2"),  # a string prefix of /data2, not a component prefix
        ("/data/scratch/x", "/data/scratch"),
        ("/datax", "/"),
        ("/data/../mnt/cfs/a", "/mnt/cfs"),  # normalised, no symlinks followed
        ("//mnt//cfs/run1/", "/mnt/cfs"),
        ("/home/user/ckpt.pt", "/"),
    ],
)
def test_longest_component_prefix_wins(path: str, mountpoint: str) -> None:
    assert mount_of(path) == mountpoint


def test_relative_path_has_no_mount() -> None:
    assert mount_of("ckpt/step-1.pt") is None


def test_the_later_mount_on_the_same_point_wins() -> None:
    stacked = find_mount(HOST_TABLE.mounts, "/mnt/stacked/a.pt")
    assert stacked is not None
    assert (stacked.mount_id, stacked.fstype) == (40, "tmpfs")


@pytest.mark.parametrize(
    ("mountpoint", "storage"),
    [
        ("/", "cloud_disk"),                 # vda1: partition of a disk with a CBS serial
        ("/mnt/cbs", "cloud_disk"),          # vdb1
        ("/mnt/lvm", "cloud_disk"),          # dm-0 over two CBS disks
        ("/data", "local_disk"),             # local NVMe, vendor serial in device/serial
        ("/srv/run1", "local_disk"),
        ("/mnt/cfs", "network_fs"),
        ("/mnt/back\\slash", "network_fs"),  # lustre (CFS Turbo)
        ("/mnt/juice", "network_fs"),
        ("/mnt/cos", "object_store"),
        ("/mnt/my bucket\ttab", "object_store"),
        ("/mnt/goofys", "object_store"),     # plain fuse, program in the source
        ("/dev/shm", "ephemeral"),
        ("/data/scratch", "ephemeral"),
        ("/mnt/stacked", "ephemeral"),
        ("/mnt/zfs", "unknown"),
    ],
)
def test_classification(mountpoint: str, storage: str) -> None:
    mount = find_mount(HOST_TABLE.mounts, mountpoint)
    assert mount is not None and mount.mountpoint == mountpoint
    assert classify(mount, TREE / "sys") == storage


def test_overlay_container_root_is_ephemeral() -> None:
    table = parse_mountinfo((TREE / "proc" / "4242" / "mountinfo").read_text())
    root = find_mount(table.mounts, "/tmp/ckpt.pt")
    assert root is not None and root.fstype == "overlay"
    assert classify(root, TREE / "sys") == "ephemeral"


def test_falls_back_to_class_block_by_source_name(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    shutil.copytree(TREE / "sys", sys_root, symlinks=True)
    (sys_root / "dev" / "block" / "253:17").unlink()  # btrfs-style anonymous device number
    table = parse_mountinfo("31 22 0:61 / /mnt/cbs rw - btrfs /dev/vdb1 rw\n")
    assert classify(table.mounts[0], sys_root) == "cloud_disk"


def test_a_disk_without_a_cbs_serial_is_local(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    shutil.copytree(TREE / "sys", sys_root, symlinks=True)
    serial = next(sys_root.glob("devices/*/*/virtio2/block/vdb/serial"))
    serial.write_text("QM00002\n")  # a QEMU default serial, not a CBS id
    cbs = find_mount(HOST_TABLE.mounts, "/mnt/cbs")
    lvm = find_mount(HOST_TABLE.mounts, "/mnt/lvm")
    assert cbs is not None and lvm is not None
    assert classify(cbs, sys_root) == "local_disk"
    assert classify(lvm, sys_root) == "cloud_disk"  # its slaves are vdc and vdd
    next(sys_root.glob("devices/*/*/virtio4/block/vdc/serial")).write_text("QM00003\n")
    assert classify(lvm, sys_root) == "local_disk"  # one slave is not a cloud disk


def test_block_device_missing_from_sysfs_is_unknown(tmp_path: Path) -> None:
    table = parse_mountinfo("31 22 8:16 / /mnt/x rw - ext4 /dev/sdb rw\n")
    assert classify(table.mounts[0], tmp_path) == "unknown"


def test_resolver_prefers_the_process_own_table() -> None:
    resolver = MountResolver(TREE / "proc", TREE / "sys")
    assert resolver.resolve("/checkpoints/step-5.pt", pid=4242) == PathStorage(
        "/checkpoints", "nfs4", "network_fs")
    assert resolver.resolve("/workspace/run/step-5.pt", pid=4242) == PathStorage(
        "/workspace", "ext4", "cloud_disk")
    assert resolver.resolve("/tmp/step-5.pt", pid=4242) == PathStorage(
        "/", "overlay", "ephemeral")
    # neither the checkpoint nor its folder is in pid 4242's root: that pid is some
    # other process (the reporter's pid is from another pid namespace)
    assert resolver.resolve("/mnt/cfs/run1/step-9.pt", pid=4242) == PathStorage(
        "/mnt/cfs", "nfs4", "network_fs")  # ... and the host sees the folder
    assert resolver.resolve("/data/ckpt/step-9.pt", pid=4242) == PathStorage(
        "", "", "unknown")  # ... and nor does the host: no guess
    # a pid that is not in this /proc (exited, or from another pid namespace): the
    # host's view where the host sees the path, else unknown
    assert resolver.resolve("/mnt/cfs/run1/step-5.pt", pid=777) == PathStorage(
        "/mnt/cfs", "nfs4", "network_fs")
    assert resolver.resolve("/data/ckpt/step-5.pt", pid=777) == PathStorage("", "", "unknown")
    assert resolver.resolve("/mnt/cfs/ckpt", pid=None) == PathStorage(
        "/mnt/cfs", "nfs4", "network_fs")


def test_resolver_falls_back_to_self_then_unknown(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    resolver = MountResolver(proc, TREE / "sys", cache_seconds=0)
    assert resolver.resolve("/data/x") == PathStorage("", "", "unknown")
    shutil.copy(TREE / "proc" / "1" / "mountinfo", proc / "self" / "mountinfo")
    assert resolver.resolve("/data/x").storage == "local_disk"
    # a report with a pid never falls back to the daemon's own namespace
    assert resolver.resolve("/data/x", pid=4242) == PathStorage("", "", "unknown")
    (proc / "1").mkdir()
    (proc / "1" / "mountinfo").write_text("garbage\n")  # nothing parseable: next table
    assert resolver.resolve("/mnt/cos/x", pid=None).storage == "object_store"


def _process(proc: Path, pid: int, table: Path, nspid: str | None = None) -> None:
    """A process directory of a fixture /proc: its mount table, its NSpid line."""
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    shutil.copy(table, folder / "mountinfo")
    status = f"Name:\tpython\nPid:\t{pid}\n" + (f"NSpid:\t{nspid}\n" if nspid else "")
    (folder / "status").write_text(status)


def test_resolver_trusts_the_kernel_named_sender(tmp_path: Path) -> None:
    """The unix socket's SCM_CREDENTIALS name the sender in the daemon's pid
    namespace: its table is used without a look into its root (which needs
    the right to inspect the process), when it is the reporter."""
    proc = tmp_path / "proc"
    container = TREE / "proc" / "4242" / "mountinfo"
    _process(proc, 1, TREE / "proc" / "1" / "mountinfo")
    _process(proc, 5100, container, nspid="5100\t17")  # pid 17 inside its container
    _process(proc, 17, TREE / "proc" / "1" / "mountinfo", nspid="17")  # another process
    _process(proc, 6200, container, nspid="6200\t99")
    resolver = MountResolver(proc, TREE / "sys")
    expected = PathStorage("/checkpoints", "nfs4", "network_fs")
    # the container reports pid 17; the kernel says the datagram came from 5100
    assert resolver.resolve("/checkpoints/step-5.pt", pid=17, sender_pid=5100) == expected
    # a host process reporting its own pid
    assert resolver.resolve("/checkpoints/step-5.pt", pid=5100, sender_pid=5100) == expected
    # a sender that is not the reporter (a relay: its innermost pid is 99, not 17)
    assert resolver.resolve("/checkpoints/step-5.pt", pid=17, sender_pid=6200) == PathStorage(
        "", "", "unknown")
    # without the kernel's word, pid 17 of this /proc cannot be told from the reporter
    assert resolver.resolve("/checkpoints/step-5.pt", pid=17) == PathStorage("", "", "unknown")


def test_resolver_caches_tables_for_cache_seconds(tmp_path: Path) -> None:
    now = [0.0]
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    table = proc / "1" / "mountinfo"
    table.write_text("1 0 0:1 / / rw - tmpfs tmpfs rw\n")
    resolver = MountResolver(proc, tmp_path, cache_seconds=30, clock=lambda: now[0])
    assert resolver.resolve("/ckpt").storage == "ephemeral"
    table.write_text("1 0 0:1 / / rw - nfs4 10.0.0.8:/ rw\n")
    now[0] = 29.0
    assert resolver.resolve("/ckpt").storage == "ephemeral"
    now[0] = 30.0
    assert resolver.resolve("/ckpt").storage == "network_fs"


def test_hostile_mountinfo_never_raises() -> None:
    text = "\n".join([
        "",
        "1 2 3",
        "x y 8:0 / / rw - ext4 /dev/sda rw",
        "1 0 8:x / / rw - ext4 /dev/sda rw",
        "1 0 8:0 / / rw -",
        "1 0 8:0 / / rw - ext4",
        "1 0 8:0 / /\\777\\0 rw - ext4 /dev/sda rw",
        "\x00\xff" * 100,
    ])
    table = parse_mountinfo(text)
    assert [mount.mountpoint for mount in table.mounts] == ["/\\777\\0"]  # 777 is no escape
    assert table.skipped == 6
