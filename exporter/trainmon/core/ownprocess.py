"""The daemon's own footprint: the standard ``process_*`` metrics.

prometheus_client's ``ProcessCollector`` (created with ``registry=None``, so it
stays out of the library's global registry) reads ``<proc>/self/stat``,
``limits`` and ``fd/`` and gives the names every Prometheus user knows:

- ``process_cpu_seconds_total``: user + system CPU time, seconds;
- ``process_resident_memory_bytes``, ``process_virtual_memory_bytes``;
- ``process_start_time_seconds``: Unix time the process started;
- ``process_open_fds``, ``process_max_fds``.

They put the footprint that ``docs/benchmarks.md`` measures (RSS, CPU per
scrape) on the node's dashboards in production. The collector runs in the
registry's isolation like any other (``collector="process"``): the library
raises on a ``limits`` file it cannot parse, and a host without procfs gets
``unavailable`` with the reason instead of a silent gap.

``proc`` is the daemon's own procfs, not ``paths.proc``: that one may be a host
mount or, in demo mode, the simulated node.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric

from trainmon.core.collector import Collector, CollectorUnavailable


class OwnProcessCollector(Collector):
    """CPU, memory and file descriptors of the process ``pid`` (this one by default)."""

    name = "process"

    def __init__(self, proc: Path = Path("/proc"), pid: int | str = "self") -> None:
        self._sources = f"{proc}/stat and {proc}/{pid}/stat"
        self._process = ProcessCollector(proc=str(proc), pid=lambda: pid, registry=None)

    def collect(self) -> Iterable[Metric]:
        families = list(self._process.collect())
        if not families:  # the library returns nothing when procfs cannot be read
            raise CollectorUnavailable(f"cannot read {self._sources} (procfs is Linux-only)")
        return families
