"""NFS collector: per-mount NFS/CFS client statistics, from ``mountstats``.

Exports, for every ``nfs``/``nfs4`` mount that ``collectors.nfs`` include/exclude
keeps (by mount point):

- ``trainmon_nfs_mount_info{mountpoint,server,export,fstype,version}`` = 1;
- ``trainmon_nfs_read_bytes_total`` / ``trainmon_nfs_write_bytes_total``
  ``{mountpoint}``: the ``bytes:`` line's *server* read and write bytes — what
  READ and WRITE RPCs moved over the wire. The ``normal``/``direct`` bytes
  count what applications asked for, page-cache hits included, so a job
  re-reading a cached shard would look like storage traffic; the server bytes
  are the part that had to wait on the network filesystem and that shows up
  on the NIC;
- ``trainmon_nfs_operations_total``, ``trainmon_nfs_operation_rtt_seconds_total``
  and ``trainmon_nfs_operation_execute_seconds_total`` ``{mountpoint,operation}``
  from the per-op statistics (rate of RTT seconds / rate of operations = mean
  RTT). Only operations that were issued at least once are exported: the
  kernel lists every procedure of the protocol (about 22 for v3, 60 for v4.1),
  most of them never used; the series count is bounded by that table per
  mount and in practice a dozen (READ, WRITE, GETATTR, LOOKUP, ACCESS, OPEN,
  READDIR(PLUS)...).

A host without NFS mounts exports nothing and is not "unavailable"; no
readable ``mountstats`` file at all is. A mount point that appears twice
(mounted over) keeps the later, visible entry. Lines that do not parse (a
mount unmounted mid-read) are left out and logged at warning level, one line
per mount point at most every five minutes. Reading and format: ``trainmon.node.mountstats``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.logthrottle import LogThrottle
from trainmon.node.mountstats import MountstatsReader, NFSMount
from trainmon.section import DeviceFilter, setting

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NFSConfig:
    """The ``collectors.nfs`` section."""

    enabled: bool = True
    #: ``include``/``exclude`` regexes over mount points (``/mnt/cfs``).
    mountpoints: DeviceFilter = field(default=DeviceFilter(), metadata=setting(inline=True))


class NFSCollector(Collector):
    """NFS client statistics per mount point."""

    name = "nfs"

    def __init__(self, config: NFSConfig, proc_root: Path) -> None:
        self._accepts = config.mountpoints.accepts
        self._reader = MountstatsReader(proc_root)
        self._problems_logged = LogThrottle(max_keys=256)
        self._health: dict[str, object] = {}

    def health(self) -> Mapping[str, object]:
        return self._health

    def collect(self) -> Iterable[Metric]:
        """Read ``mountstats`` now; build fresh families (none without NFS mounts)."""
        reading = self._reader.read()
        by_mount: dict[str, list[str]] = {}
        for problem in reading.problems:
            where, _, what = problem.partition(": ")
            by_mount.setdefault(where if what else "", []).append(problem)
        for where, problems in by_mount.items():
            if self._problems_logged.allow(where):  # per mount point, at most every 5 min
                log.warning(
                    "%s: %s; those counters are omitted", reading.path, "; ".join(problems)
                )
        mounts: dict[str, NFSMount] = {}
        for mount in reading.mounts:
            if self._accepts(mount.mountpoint):
                mounts.pop(mount.mountpoint, None)
                mounts[mount.mountpoint] = mount  # a later entry was mounted over it
        self._health = {
            "source": str(reading.path),
            "mounts": len(mounts),
            "unparsed_lines": len(reading.problems),
        }
        return _families(mounts.values())


def _families(mounts: Iterable[NFSMount]) -> list[Metric]:
    info = GaugeMetricFamily(
        "trainmon_nfs_mount_info",
        "An NFS (or NFS-based, e.g. Tencent CFS) mount; version from opts vers=; always 1.",
        labels=["mountpoint", "server", "export", "fstype", "version"],
    )
    read_bytes = CounterMetricFamily(
        "trainmon_nfs_read_bytes_total",
        "Bytes read from the server by READ RPCs (mountstats bytes: serverreadbytes): "
        "what crossed the network, page-cache hits excluded.",
        labels=["mountpoint"],
    )
    write_bytes = CounterMetricFamily(
        "trainmon_nfs_write_bytes_total",
        "Bytes written to the server by WRITE RPCs (mountstats bytes: serverwrittenbytes).",
        labels=["mountpoint"],
    )
    operations = CounterMetricFamily(
        "trainmon_nfs_operations_total",
        "NFS requests issued, per operation (mountstats per-op ops); operations never "
        "issued are omitted.",
        labels=["mountpoint", "operation"],
    )
    rtt = CounterMetricFamily(
        "trainmon_nfs_operation_rtt_seconds_total",
        "Seconds from sending NFS requests to the server's replies, summed, per operation "
        "(per-op rtt); divide by the operations' rate for the mean round trip.",
        labels=["mountpoint", "operation"],
    )
    execute = CounterMetricFamily(
        "trainmon_nfs_operation_execute_seconds_total",
        "Seconds NFS requests took from queueing to completion (client queue + round "
        "trip), summed, per operation (per-op execute).",
        labels=["mountpoint", "operation"],
    )
    for mount in mounts:
        point = mount.mountpoint
        info.add_metric([point, mount.server, mount.export, mount.fstype, mount.version], 1.0)
        if "server_read" in mount.bytes:
            read_bytes.add_metric([point], mount.bytes["server_read"])
            write_bytes.add_metric([point], mount.bytes["server_write"])
        for name, statistics in sorted(mount.operations.items()):
            if statistics.operations == 0:
                continue
            operations.add_metric([point, name], statistics.operations)
            rtt.add_metric([point, name], statistics.rtt_seconds)
            execute.add_metric([point, name], statistics.execute_seconds)
    families: list[Metric] = [info, read_bytes, write_bytes, operations, rtt, execute]
    return [family for family in families if family.samples]


def _build(config: NFSConfig, wiring: Wiring) -> Collector:
    return NFSCollector(config, wiring.proc_root)


ENTRY = CollectorEntry("nfs", NFSConfig, _build)
