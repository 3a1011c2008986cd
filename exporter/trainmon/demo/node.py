"""A simulated node's ``/proc`` and ``/sys`` files for ``trainmon serve --demo``.

The demo runs the real network, InfiniBand and disk collectors; only their
roots point here instead of at the kernel. A thread rewrites the files once a
second with counters that grow at rates matching the demo's two jobs: the
data-starved job on GPUs 0–3 streams its dataset from a network filesystem
(steady NIC receive, modest local-disk reads) and the healthy job on GPUs 4–7
synchronises gradients over InfiniBand. Files are replaced atomically (write,
then rename) so a scrape never reads half a file.

Platform files of the same story:

- **NUMA.** Two nodes, ``node0`` with CPUs 0-31 and ``node1`` with 32-63;
  GPUs 0-3 hang off node 0 and 4-7 off node 1 (``sys/bus/pci/devices/<bus
  id>/numa_node``, bus ids from ``trainmon.demo.gpus``). Every simulated GPU
  process has a ``proc/<pid>/status`` whose ``Cpus_allowed_list`` is its GPU's
  socket — except the starved job's process on GPU 3, which is bound to CPUs
  32-47 on the far socket, so the far-NUMA finding has something to show.
- **Who holds the GPUs.** Each rank's process has a ``proc/<pid>/environ``
  naming its job (``TRAINMON_JOB``) and its team (``SLURM_JOB_ACCOUNT``); the
  notebook left open on GPU 7 (``trainmon.demo.gpus.NOTEBOOK_PID``) has one
  naming ``demo-notebook`` of team ``research``, which never reports: the
  goodput ledger's ``idle_allocated``.
- **Mounts.** ``proc/1/mountinfo`` (and the same table for the daemon's own
  pid, whose demo jobs send the checkpoints) holds ``/`` (ext4 on ``/dev/sda``, 8:0),
  ``/data`` (xfs on ``/dev/nvme0n1p1``, 259:1), ``/mnt/cfs`` (nfs4,
  ``10.0.0.8:/cfs-dataset``) and ``/dev/shm`` (tmpfs), with
  ``sys/dev/block/8:0`` and ``259:1`` linking to their ``class/block`` entries.
  ``proc/1/mountstats`` gives the CFS mount's NFS statistics: its server read
  bytes grow at eth0's receive rate (the starved job's dataset) in 1 MiB
  READs, with GETATTR, LOOKUP, ACCESS, OPEN and CLOSE traffic beside them.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainmon.background import BackgroundThread
from trainmon.demo.gpus import (
    GPU_COUNT,
    NOTEBOOK_JOB,
    NOTEBOOK_PID,
    NOTEBOOK_TEAM,
    STARVED_GPUS,
    pci_bus_id,
    process_pid,
)
from trainmon.demo.jobs import DEMO_JOBS
from trainmon.node.diskstats import SECTOR_BYTES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimulatedNIC:
    name: str
    speed_mbits: int | None  # None: a virtual device without a link speed
    receive_bytes_per_second: float
    transmit_bytes_per_second: float
    mean_packet_bytes: float = 1400.0


@dataclass(frozen=True)
class SimulatedDisk:
    name: str
    major: int
    minor: int
    read_iops: float
    write_iops: float
    read_bytes_per_io: float
    write_bytes_per_io: float
    utilization: float  # fraction of wall time with I/O in flight
    partition_of: str | None = None


@dataclass(frozen=True)
class SimulatedHCA:
    name: str
    port: int
    rate: str
    state: str
    bytes_per_second: float


NICS = (
    SimulatedNIC("lo", None, 2e5, 2e5, 400),
    SimulatedNIC("eth0", 25_000, 180e6, 12e6),  # the starved job's dataset, from NFS
    SimulatedNIC("docker0", None, 1e4, 1e4, 300),
)
DISKS = (
    SimulatedDisk("nvme0n1", 259, 0, 2400, 60, 128 * 1024, 256 * 1024, 0.35),
    SimulatedDisk("nvme0n1p1", 259, 1, 2400, 60, 128 * 1024, 256 * 1024, 0.35, "nvme0n1"),
    SimulatedDisk("sda", 8, 0, 2, 15, 4096, 16384, 0.02),
    SimulatedDisk("loop0", 7, 0, 0, 0, 4096, 4096, 0.0),
)
HCAS = (
    SimulatedHCA("mlx5_0", 1, "200 Gb/sec (4X HDR)", "4: ACTIVE", 9.5e9),
    SimulatedHCA("mlx5_1", 1, "200 Gb/sec (4X HDR)", "4: ACTIVE", 9.3e9),
)

#: NUMA node → its CPU list.
NUMA_NODES = {0: "0-31", 1: "32-63"}
#: The starved job's process bound to the socket far from its GPU, and where.
FAR_NUMA_GPU = 3
FAR_NUMA_CPUS = "32-47"

#: ``proc/1/mountinfo`` (the checkpoint storage classification reads it).
MOUNTINFO = (
    "22 1 8:0 / / rw,relatime shared:1 - ext4 /dev/sda rw,errors=remount-ro\n"
    "24 22 0:23 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw,size=263921464k\n"
    "31 22 259:1 / /data rw,noatime shared:12 - xfs /dev/nvme0n1p1 "
    "rw,attr2,inode64,logbufs=8,logbsize=32k,noquota\n"
    "45 22 0:52 / /mnt/cfs rw,relatime shared:20 - nfs4 10.0.0.8:/cfs-dataset "
    "rw,vers=4.0,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,"
    "sec=sys,clientaddr=10.0.0.21,local_lock=none,addr=10.0.0.8\n"
)
#: ``sys/dev/block/<major>:<minor>`` → the ``class/block`` entry it links to.
BLOCK_DEVICE_LINKS = {"8:0": "sda", "259:1": "nvme0n1p1"}
#: The CFS mount's server read bytes per second: eth0's receive rate (the dataset).
CFS_READ_BYTES_PER_SECOND = 180e6
CFS_READ_SIZE = 1 << 20  # rsize
#: NFS operation → (operations per second, mean RTT ms, mean execute ms, bytes sent,
#: bytes received per operation); READ is derived from the read rate.
CFS_OPERATIONS = {
    "READ": (CFS_READ_BYTES_PER_SECOND / CFS_READ_SIZE, 4.6, 5.3, 200, CFS_READ_SIZE + 124),
    "GETATTR": (38.0, 0.55, 0.62, 180, 240),
    "LOOKUP": (4.5, 0.7, 0.8, 220, 260),
    "ACCESS": (2.0, 0.5, 0.56, 190, 200),
    "OPEN": (3.2, 1.1, 1.3, 300, 380),
    "CLOSE": (3.2, 0.6, 0.7, 200, 150),
}
#: Procedures listed with zero counts, as the kernel lists every one of them.
CFS_IDLE_OPERATIONS = ("NULL", "WRITE", "COMMIT", "SETATTR", "REMOVE", "RENAME", "READDIR")


class SimulatedNodeFiles:
    """Writes and refreshes the fake tree under ``root`` (``root/proc``, ``root/sys``)."""

    def __init__(
        self,
        root: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float = 1.0,
    ) -> None:
        self._owned = root is None
        self.root = Path(tempfile.mkdtemp(prefix="trainmon-demo-")) if root is None else root
        self._clock = clock
        self._started = clock()
        self._refresh_seconds = refresh_seconds
        self._thread = BackgroundThread("demo-node", self._run)
        self._build_static_tree()
        self.refresh()

    @property
    def proc_root(self) -> Path:
        return self.root / "proc"

    @property
    def sys_root(self) -> Path:
        return self.root / "sys"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
        if self._owned:
            shutil.rmtree(self.root, ignore_errors=True)

    def refresh(self) -> None:
        elapsed = self._clock() - self._started + 3600.0  # as if booted an hour ago
        self._write(self.proc_root / "net" / "dev", _net_dev(elapsed))
        self._write(self.proc_root / "diskstats", _diskstats(elapsed))
        self._write(self.proc_root / "1" / "mountstats", _mountstats(elapsed))
        for hca in HCAS:
            counters = self.sys_root / "class" / "infiniband" / hca.name / "ports" / str(hca.port)
            words = int(hca.bytes_per_second * elapsed / 4)
            packets = int(hca.bytes_per_second * elapsed / 4096)
            self._write(counters / "counters_ext" / "port_rcv_data_64", f"{words}\n")
            self._write(counters / "counters_ext" / "port_xmit_data_64", f"{words}\n")
            self._write(counters / "counters_ext" / "port_rcv_packets_64", f"{packets}\n")
            self._write(counters / "counters_ext" / "port_xmit_packets_64", f"{packets}\n")

    def _run(self) -> None:
        while not self._thread.stopping.wait(self._refresh_seconds):
            try:
                self.refresh()
            except OSError:
                log.exception("demo node files could not be refreshed")

    def _build_static_tree(self) -> None:
        for nic in NICS:
            if nic.speed_mbits is not None:
                self._write(
                    self.sys_root / "class" / "net" / nic.name / "speed", f"{nic.speed_mbits}\n"
                )
            else:
                (self.sys_root / "class" / "net" / nic.name).mkdir(parents=True, exist_ok=True)
        for disk in DISKS:
            entry = self.sys_root / "class" / "block" / disk.name
            entry.mkdir(parents=True, exist_ok=True)
            if disk.partition_of is None:
                (self.sys_root / "block" / disk.name).mkdir(parents=True, exist_ok=True)
            else:
                self._write(entry / "partition", "1\n")
        for hca in HCAS:
            port = self.sys_root / "class" / "infiniband" / hca.name / "ports" / str(hca.port)
            self._write(port / "rate", f"{hca.rate}\n")
            self._write(port / "state", f"{hca.state}\n")
            self._write(port / "phys_state", "5: LinkUp\n")
            self._write(port / "link_layer", "InfiniBand\n")
            for counter in (
                "symbol_error",
                "link_downed",
                "port_rcv_errors",
                "port_xmit_discards",
                "link_error_recovery",
            ):
                self._write(port / "counters" / counter, "0\n")
        self._build_numa()
        # The demo's jobs run in this process, which sends their checkpoints: its
        # mount namespace is the simulated host's.
        for process in ("1", str(os.getpid())):
            self._write(self.proc_root / process / "mountinfo", MOUNTINFO)
        links = self.sys_root / "dev" / "block"
        links.mkdir(parents=True, exist_ok=True)
        for number, name in BLOCK_DEVICE_LINKS.items():
            if not (links / number).is_symlink():
                (links / number).symlink_to(Path("..") / ".." / "class" / "block" / name)

    def _build_numa(self) -> None:
        nodes = self.sys_root / "devices" / "system" / "node"
        for node, cpus in NUMA_NODES.items():
            self._write(nodes / f"node{node}" / "cpulist", f"{cpus}\n")
        self._write(nodes / "online", f"0-{len(NUMA_NODES) - 1}\n")
        for gpu in range(GPU_COUNT):
            node = 0 if gpu in STARVED_GPUS else 1
            device = self.sys_root / "bus" / "pci" / "devices" / pci_bus_id(gpu)[4:].lower()
            self._write(device / "numa_node", f"{node}\n")
            cpus = FAR_NUMA_CPUS if gpu == FAR_NUMA_GPU else NUMA_NODES[node]
            self._write(self.proc_root / str(process_pid(gpu)) / "status", _status(gpu, cpus))
        for job in DEMO_JOBS:
            for gpu in job.gpus:
                self._write(self.proc_root / str(process_pid(gpu)) / "environ",
                            _environ(job.name, job.team))
        self._write(self.proc_root / str(NOTEBOOK_PID) / "environ",
                    _environ(NOTEBOOK_JOB, NOTEBOOK_TEAM))

    @staticmethod
    def _write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(text)
        os.replace(temporary, path)


def _net_dev(elapsed: float) -> str:
    lines = [
        "Inter-|   Receive                                                |  Transmit",
        " face |bytes    packets errs drop fifo frame compressed multicast|"
        "bytes    packets errs drop fifo colls carrier compressed",
    ]
    for nic in NICS:
        rx = int(nic.receive_bytes_per_second * elapsed)
        tx = int(nic.transmit_bytes_per_second * elapsed)
        rx_packets = int(rx / nic.mean_packet_bytes)
        tx_packets = int(tx / nic.mean_packet_bytes)
        drops = int(elapsed / 600)  # the odd drop every ten minutes
        lines.append(
            f"{nic.name:>6}: {rx} {rx_packets} 0 {drops} 0 0 0 0 {tx} {tx_packets} 0 0 0 0 0 0"
        )
    return "\n".join(lines) + "\n"


def _diskstats(elapsed: float) -> str:
    lines = []
    for disk in DISKS:
        reads = int(disk.read_iops * elapsed)
        writes = int(disk.write_iops * elapsed)
        read_sectors = int(reads * disk.read_bytes_per_io / SECTOR_BYTES)
        write_sectors = int(writes * disk.write_bytes_per_io / SECTOR_BYTES)
        busy_ms = int(disk.utilization * elapsed * 1000)
        read_ms = int(busy_ms * 0.8)
        write_ms = busy_ms - read_ms
        in_flight = 4 if disk.utilization > 0.2 else 0
        lines.append(
            f"{disk.major:4d} {disk.minor:7d} {disk.name} {reads} 0 {read_sectors} {read_ms} "
            f"{writes} 0 {write_sectors} {write_ms} {in_flight} {busy_ms} {busy_ms * 2} "
            "0 0 0 0 0 0"
        )
    return "\n".join(lines) + "\n"


def _status(gpu: int, cpus: str) -> str:
    """``/proc/<pid>/status`` of the simulated process on ``gpu`` (the lines that matter)."""
    pid = process_pid(gpu)
    first, last = (int(part) for part in cpus.split("-"))
    mask = sum(1 << cpu for cpu in range(first, last + 1))
    return (
        f"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\n"
        f"Pid:\t{pid}\nPPid:\t{40990 + gpu // 4}\nThreads:\t48\n"
        f"Cpus_allowed:\t{mask >> 32:08x},{mask & 0xFFFFFFFF:08x}\n"
        f"Cpus_allowed_list:\t{cpus}\n"
        f"Mems_allowed_list:\t{0 if gpu in STARVED_GPUS else 1}\n"
        "voluntary_ctxt_switches:\t152311\nnonvoluntary_ctxt_switches:\t2210\n"
    )


def _environ(job: str, team: str) -> str:
    """``/proc/<pid>/environ`` of a simulated process (NUL-separated)."""
    return f"TRAINMON_JOB={job}\0SLURM_JOB_ACCOUNT={team}\0HOME=/home/{team}\0"


def _mountstats(elapsed: float) -> str:
    """``/proc/1/mountstats``: every mount of ``MOUNTINFO``, statistics for the NFS one."""
    age = int(elapsed)
    server_read = int(CFS_READ_BYTES_PER_SECOND * elapsed)
    normal_read = int(server_read * 1.08)  # a few page-cache hits on top of the wire bytes
    lines = [
        "device /dev/sda mounted on / with fstype ext4",
        "device tmpfs mounted on /dev/shm with fstype tmpfs",
        "device /dev/nvme0n1p1 mounted on /data with fstype xfs",
        "device 10.0.0.8:/cfs-dataset mounted on /mnt/cfs with fstype nfs4 statvers=1.1",
        "\topts:\trw,vers=4.0,rsize=1048576,wsize=1048576,namlen=255,acregmin=3,acregmax=60,"
        "acdirmin=30,acdirmax=60,hard,proto=tcp,timeo=600,retrans=2,sec=sys,"
        "clientaddr=10.0.0.21,local_lock=none",
        f"\tage:\t{age}",
        "\tcaps:\tcaps=0xfff7,wtmult=512,dtsize=32768,bsize=0,namlen=255",
        "\tsec:\tflavor=1,pseudoflavor=1",
        f"\tevents:\t{int(38 * elapsed)} {int(4.5 * elapsed)} 0 12 {int(3.2 * elapsed)} "
        f"{int(4.5 * elapsed)} {int(2 * elapsed)} 0 0 0 {server_read // 4096} 0 0 0 0 0 0 0 0 "
        "0 0 0 0 0 0 0 0",
        f"\tbytes:\t{normal_read} 0 0 0 {server_read} 0 {server_read // 4096} 0",
        "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)",
        f"\txprt:\ttcp 822 1 1 0 0 {int(250 * elapsed)} {int(250 * elapsed)} 0 "
        f"{int(1200 * elapsed)} 0 32 {int(12 * elapsed)} {int(40 * elapsed)}",
        "\tper-op statistics",
    ]
    for name, (rate, rtt_ms, execute_ms, sent, received) in CFS_OPERATIONS.items():
        count = int(rate * elapsed)
        lines.append(
            f"\t{name:>12}: {count} {count} 0 {count * sent} {count * received} "
            f"{int(count * 0.02)} {int(count * rtt_ms)} {int(count * execute_ms)} 0"
        )
    lines.extend(f"\t{name:>12}: 0 0 0 0 0 0 0 0 0" for name in CFS_IDLE_OPERATIONS)
    return "\n".join(lines) + "\n\n"
