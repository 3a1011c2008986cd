"""The daemon's own footprint: the standard ``process_*`` metrics.

The names, HELP texts and values of prometheus_client's ``ProcessCollector``
(``tests/core/test_ownprocess.py`` holds them to it), read from
``<proc>/stat`` (boot time, once), ``<proc>/<pid>/stat``, ``limits`` and ``fd/``:

- ``process_cpu_seconds_total``: user + system CPU time, seconds;
- ``process_resident_memory_bytes``, ``process_virtual_memory_bytes``;
- ``process_start_time_seconds``: Unix time the process started;
- ``process_open_fds``, ``process_max_fds``.

They put the footprint that ``docs/benchmarks.md`` measures (RSS, CPU per
scrape) on the node's dashboards in production. The files are read here with
``trainmon.core.files.read_file`` rather than by the library, whose buffered
reads cost twice the system calls on every scrape. The collector runs in the
registry's isolation like any other (``collector="process"``): a ``limits``
file it cannot parse fails it, as it fails the library, and a host without
procfs gets ``unavailable`` with the reason instead of a silent gap.

``proc`` is the daemon's own procfs, not ``paths.proc``: that one may be a host
mount or, in demo mode, the simulated node.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.core.files import read_file


class OwnProcessCollector(Collector):
    """CPU, memory and file descriptors of the process ``pid`` (this one by default)."""

    name = "process"

    def __init__(self, proc: Path = Path("/proc"), pid: int | str = "self") -> None:
        self._sources = f"{proc}/stat and {proc}/{pid}/stat"
        self._stat = proc / str(pid) / "stat"
        self._limits = proc / str(pid) / "limits"
        self._fds = proc / str(pid) / "fd"
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._boot_time = _boot_time(proc / "stat")

    def collect(self) -> Iterable[Metric]:
        families: list[Metric] = []
        if self._boot_time:
            families.extend(self._stat_families())
            families.extend(self._fd_families())
        if not families:
            raise CollectorUnavailable(f"cannot read {self._sources} (procfs is Linux-only)")
        return families

    def _stat_families(self) -> list[Metric]:
        try:
            fields = read_file(self._stat).split(b")")[-1].split()
        except OSError:
            return []
        ticks = self._ticks
        return [
            GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                              value=float(fields[20])),
            GaugeMetricFamily("process_resident_memory_bytes", "Resident memory size in bytes.",
                              value=float(fields[21]) * self._page_bytes),
            GaugeMetricFamily("process_start_time_seconds",
                              "Start time of the process since unix epoch in seconds.",
                              value=float(fields[19]) / ticks + self._boot_time),
            CounterMetricFamily("process_cpu_seconds_total",
                                "Total user and system CPU time spent in seconds.",
                                value=float(fields[11]) / ticks + float(fields[12]) / ticks),
        ]

    def _fd_families(self) -> list[Metric]:
        try:
            limits = read_file(self._limits)
            open_fds = len(os.listdir(self._fds))
        except OSError:
            return []
        return [
            GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", open_fds),
            GaugeMetricFamily("process_max_fds", "Maximum number of open file descriptors.",
                              value=_max_open_files(limits)),
        ]


def _boot_time(stat: Path) -> float:
    """The ``btime`` of ``<proc>/stat``, seconds since the epoch; 0 when unreadable."""
    try:
        text = read_file(stat)
    except OSError:
        return 0.0
    for line in text.split(b"\n"):
        if line.startswith(b"btime "):
            return float(line.split()[1])
    return 0.0


def _max_open_files(limits: bytes) -> float:
    """The soft limit of the ``Max open files`` line; ``ValueError`` when it is absent
    or not a number (``unlimited``)."""
    for line in limits.split(b"\n"):
        if line.startswith(b"Max open file"):
            return float(line.split()[3])
    raise ValueError("no 'Max open files' line in limits")
