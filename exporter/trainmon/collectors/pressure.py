"""Pressure collector: the node's CPU evidence for a slowed job, and each rank's throttling.

Exports (readers in ``trainmon.node.pressure``):

- ``trainmon_node_pressure_seconds_total{resource,scope}``: cumulative stall
  time from ``<proc>/pressure/{cpu,io,memory}`` (PSI ``total``, µs / 1e6);
  omitted on kernels without PSI (or booted ``psi=0``), and for the
  system-wide ``cpu`` ``full`` line, which is zero by definition;
- ``trainmon_node_cpu_steal_seconds_total``: the ``steal`` column of
  ``<proc>/stat``'s ``cpu`` line, ``USER_HZ`` ticks / ``SC_CLK_TCK``, all CPUs
  summed;
- ``trainmon_training_rank_cpu_throttled_seconds_total{job,owner,rank}``: CFS
  bandwidth throttling of the cgroup the rank's process runs in (v2
  ``throttled_usec``, v1 ``throttled_time``): a ``cpu.max`` / ``cpu.cfs_quota_us``
  below what the rank uses shows here as seconds per second.

Which process a rank is: the training store's ``sender_pid``, the pid the kernel
attached to the rank's latest report on the unix socket (``SCM_CREDENTIALS``),
translated into the daemon's pid namespace. The pid a client writes into its
reports (``trainmon_training_rank_info{pid}``) is its own namespace's: in a
container without ``hostPID`` it names another process of the host, so it is
never used here. A rank that reports over HTTP, or from outside the daemon's pid
namespace, has no ``sender_pid`` and no throttling series (counted in
``/healthz`` as ``ranks_unidentified``). The daemon must see the host's ``/proc``
and ``/sys/fs/cgroup`` in the host's cgroup namespace (a DaemonSet with
``hostPID`` and the host's ``/sys``; ``docs/deploy.md``).

Derived only in its place in the scrape order (after ``training``, whose store it
reads, and before ``diagnosis``, which reads its families); it is collected on
scrapes like a source. Cost per scrape: three PSI files and ``/proc/stat``, and
two small files per rank (``/proc/<pid>/cgroup``, ``cpu.stat``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainmon.collectors.training import TrainingCollector
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, Metric
from trainmon.node.pressure import CPUEvidenceReader
from trainmon.training.store import TrainingStore


@dataclass(frozen=True)
class PressureConfig:
    """The ``collectors.pressure`` section: node CPU pressure, steal and rank throttling."""

    enabled: bool = True


class PressureCollector(Collector):
    """PSI stall time, steal time and the throttled time of each rank's cgroup."""

    name = "pressure"

    def __init__(self, proc_root: Path, sys_root: Path, store: TrainingStore | None = None,
                 *, user_hz: int | None = None) -> None:
        """``store``: the training store whose ranks' throttling is read (None: none)."""
        self._reader = CPUEvidenceReader(proc_root, sys_root, user_hz=user_hz)
        self._store = store
        self._health: dict[str, object] = {}

    def health(self) -> Mapping[str, object]:
        return self._health

    def collect(self) -> Iterable[Metric]:
        pressure = CounterMetricFamily(
            "trainmon_node_pressure_seconds_total",
            "Time tasks stalled waiting for the resource (PSI /proc/pressure/<resource>, "
            "total µs / 1e6): scope some = at least one task, full = all non-idle tasks.",
            labels=["resource", "scope"],
        )
        for totals in self._reader.pressure():
            for scope, seconds in totals.seconds.items():
                pressure.add_metric([totals.resource, scope], seconds)
        steal = CounterMetricFamily(
            "trainmon_node_cpu_steal_seconds_total",
            "Time the hypervisor ran something else while a vCPU wanted to run, all CPUs "
            "summed (/proc/stat cpu steal, USER_HZ ticks), seconds.",
        )
        steal_seconds = self._reader.steal_seconds()
        if steal_seconds is not None:
            steal.add_metric([], steal_seconds)
        throttled = CounterMetricFamily(
            "trainmon_training_rank_cpu_throttled_seconds_total",
            "CFS bandwidth throttled time of the cgroup the rank's process runs in (cpu.stat "
            "throttled_usec v2, throttled_time v1), seconds; shared by the cgroup's processes.",
            labels=["job", "owner", "rank"],
        )
        ranks = unidentified = 0
        if self._store is not None:
            for view in self._store.snapshot().ranks:
                ranks += 1
                if view.sender_pid is None:  # HTTP, or outside our pid namespace
                    unidentified += 1
                    continue
                throttled_seconds = self._reader.throttled_seconds(view.sender_pid)
                if throttled_seconds is not None:
                    throttled.add_metric([view.job, view.owner, str(view.rank)],
                                         throttled_seconds)
        self._health = {
            "psi": bool(pressure.samples),
            "ranks": ranks,
            "ranks_unidentified": unidentified,
            "ranks_measured": len(throttled.samples),
        }
        return [family for family in (pressure, steal, throttled) if family.samples]


def _build(config: PressureConfig, wiring: Wiring) -> Collector:
    training = wiring.built.get("training")
    store = training.store if isinstance(training, TrainingCollector) else None
    return PressureCollector(wiring.proc_root, wiring.sys_root, store)


#: Derived in order only: after ``training`` (its store, when it is on), before
#: ``diagnosis`` (which reads these families); collected on scrapes.
ENTRY = CollectorEntry("pressure", PressureConfig, _build, derived=True)
