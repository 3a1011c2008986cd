"""A simulated node's ``/proc`` and ``/sys`` files for ``trainmon serve --demo``.

The demo runs the real network, InfiniBand and disk collectors; only their
roots point here instead of at the kernel. A thread rewrites the files once a
second with counters that grow at rates matching the demo's two jobs: the
data-starved job on GPUs 0–3 streams its dataset from a network filesystem
(steady NIC receive, modest local-disk reads) and the healthy job on GPUs 4–7
synchronises gradients over InfiniBand. Files are replaced atomically (write,
then rename) so a scrape never reads half a file.
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
