"""CPU evidence for a slowed job: pressure stall time, steal time, a cgroup's throttled time.

Three kernel sources, each read now and parsed here (the collector only turns
them into metrics, ``trainmon.collectors.pressure``):

- **Pressure stall information** (PSI, Linux 4.20+, ``CONFIG_PSI``):
  ``<proc>/pressure/{cpu,io,memory}``, one line per scope::

      some avg10=0.26 avg60=0.28 avg300=1.82 total=16090978071
      full avg10=0.00 avg60=0.00 avg300=0.00 total=0

  ``total`` is the cumulative stall time in microseconds since boot: ``some``
  while at least one runnable task waited for the resource, ``full`` while all
  non-idle tasks did. The ``avg*`` figures are the kernel's own decaying
  averages; the counter is what a rate is taken over. A kernel without PSI has
  no ``pressure`` folder; one booted with ``psi=0`` has the files but fails
  the read (``EOPNOTSUPP``): both read as *no sample*, never as zero. The
  system-wide ``cpu`` ``full`` line (printed since 5.13 for the format's sake)
  is zero by definition (docs/accounting/psi.rst: "CPU full is undefined at
  the system level"), so it is left out.
- **Steal time**: the eighth value of the ``cpu`` line of ``<proc>/stat``
  (``user nice system idle iowait irq softirq steal ...``), in ``USER_HZ``
  ticks (``os.sysconf("SC_CLK_TCK")``, 100 on every mainstream architecture),
  summed over the CPUs: the time the hypervisor ran something else while a
  vCPU wanted to run. Kernels before 2.6.11 print no such column.
- **CFS bandwidth throttling of a process's cgroup**: the cgroup of the
  ``cpu`` controller in ``<proc>/<pid>/cgroup``, then its ``cpu.stat``:

  ======== ============================================== ===================================
  version  cgroup line / folder                            ``cpu.stat`` field
  ======== ============================================== ===================================
  v1       ``4:cpu,cpuacct:/kubepods/…`` →                 ``throttled_time`` (nanoseconds)
           ``<sys>/fs/cgroup/cpu,cpuacct/kubepods/…``
           (else ``<sys>/fs/cgroup/cpu/…``)
  v2       ``0::/system.slice/…`` →                        ``throttled_usec`` (microseconds)
           ``<sys>/fs/cgroup/system.slice/…``
           (``<sys>/fs/cgroup/unified/…`` on a hybrid
           host, where the cpu controller is seldom
           bound to v2)
  ======== ============================================== ===================================

  A v1 line naming the ``cpu`` controller wins over the v2 line (on a hybrid
  host the controller is bound to v1). The folders are where systemd,
  Docker and kubelet mount the hierarchies (the v1 folder is named after the
  line's controller list, and systemd links ``cpu`` to it); a host that mounts
  them elsewhere gives no reading. The time is the **cgroup's**: every process
  in it shares it (a container of 8 ranks shows the same figure for each). A
  process moved to another cgroup reads the new cgroup's count, which may be
  lower: a counter reset for Prometheus. A path outside the reader's cgroup
  namespace (``/../…``, a daemon in a private cgroup namespace) gives ``None``.

Parsers raise nothing on odd text: a line or field they do not know is skipped.
``CPUEvidenceReader`` reads through ``KernelFileReader`` (a missing or unreadable
file gives ``None``, logged once per path at debug level).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainmon.node.kernelfiles import KernelFileReader

log = logging.getLogger(__name__)

#: The PSI files read, by ``resource`` label.
PRESSURE_RESOURCES: tuple[str, ...] = ("cpu", "io", "memory")
#: The scopes of a PSI file (``scope`` label).
PRESSURE_SCOPES: tuple[str, ...] = ("some", "full")
#: Position of ``steal`` among the values of ``/proc/stat``'s ``cpu`` line.
STEAL_COLUMN = 7
#: ``cpu.stat`` files remembered by the cgroup file that leads to them (cleared when full).
MAX_REMEMBERED_CGROUPS = 1024


@dataclass(frozen=True)
class PressureTotals:
    """Cumulative stall seconds of one resource since boot, by scope (``some``, ``full``)."""

    resource: str
    seconds: Mapping[str, float]


def parse_pressure(text: str) -> dict[str, float]:
    """``scope`` → cumulative stall seconds (``total=`` µs / 1e6) of a PSI file's text.

    Lines of another scope, without a ``total=`` or with a non-integer one are
    skipped; an empty text gives an empty mapping.
    """
    totals: dict[str, float] = {}
    for line in text.splitlines():
        scope, _, fields = line.partition(" ")
        if scope not in PRESSURE_SCOPES:
            continue
        for field in fields.split():
            key, _, value = field.partition("=")
            if key == "total" and value.isdigit():
                totals[scope] = int(value) / 1e6
    return totals


def parse_steal_ticks(text: str) -> int | None:
    """The ``steal`` ticks (``USER_HZ``, all CPUs) of a ``/proc/stat`` text; ``None``
    without a ``cpu`` line, with too few values or a non-integer one."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = line.split()[1:]
            if len(values) > STEAL_COLUMN and values[STEAL_COLUMN].isdigit():
                return int(values[STEAL_COLUMN])
            return None
    return None


@dataclass(frozen=True)
class CpuCgroup:
    """The cgroup of a process's ``cpu`` controller."""

    #: 1 or 2.
    version: int
    #: The cgroup path as ``/proc/<pid>/cgroup`` gives it (``/kubepods/…``).
    path: str
    #: v1: the line's controller list (``cpu,cpuacct``), the name of its mount folder.
    controllers: str = ""


def cpu_cgroup(text: str) -> CpuCgroup | None:
    """The ``cpu`` controller's cgroup in a ``/proc/<pid>/cgroup`` text: the v1 line
    that names ``cpu`` (exactly, not ``cpuacct``/``cpuset``), else the v2 ``0::`` line;
    ``None`` without either, or for a path outside the reader's cgroup namespace."""
    unified: CpuCgroup | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hierarchy, controllers, path = parts
        if ".." in path.split("/"):
            return None  # outside our cgroup namespace: its folder is not ours to name
        if hierarchy == "0" and controllers == "":
            unified = CpuCgroup(2, path)
        elif "cpu" in controllers.split(","):
            return CpuCgroup(1, path, controllers)
    return unified


def parse_throttled_seconds(text: str, version: int) -> float | None:
    """Throttled seconds in a ``cpu.stat`` text: v1 ``throttled_time`` (ns), v2
    ``throttled_usec`` (µs); ``None`` where the field is absent (v2 without the cpu
    controller enabled for the cgroup shows only the ``usage_usec`` lines)."""
    field, per_second = ("throttled_time", 1e9) if version == 1 else ("throttled_usec", 1e6)
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == field and value.strip().isdigit():
            return int(value) / per_second
    return None


class CPUEvidenceReader:
    """Reads PSI, steal time and cgroup throttling under one ``/proc`` and ``/sys`` root.

    ``proc_root`` must show the host's pid namespace for ``throttled_seconds``
    (pids of the daemon's namespace; ``trainmon.collectors.pressure`` passes the
    ones the kernel vouches for) and the host's ``/proc/stat`` and ``pressure``.
    """

    def __init__(self, proc_root: Path, sys_root: Path, *,
                 user_hz: int | None = None) -> None:
        self._proc = proc_root
        self._cgroup_root = sys_root / "fs" / "cgroup"
        self._files = KernelFileReader(log)
        self._user_hz = user_hz if user_hz is not None else os.sysconf("SC_CLK_TCK")
        #: ``/proc/<pid>/cgroup`` text -> (its ``cpu.stat`` file, cgroup version).
        self._stat_files: dict[str, tuple[Path, int]] = {}

    def pressure(self) -> list[PressureTotals]:
        """The stall totals of every PSI file present (none without PSI)."""
        found = []
        for resource in PRESSURE_RESOURCES:
            text = self._files.text(self._proc / "pressure" / resource)
            if text is None:
                continue
            seconds = parse_pressure(text)
            if resource == "cpu":
                seconds.pop("full", None)  # undefined system-wide: always 0
            if seconds:
                found.append(PressureTotals(resource, seconds))
        return found

    def steal_seconds(self) -> float | None:
        """Steal time of all CPUs since boot, seconds; ``None`` when not told."""
        text = self._files.text(self._proc / "stat")
        ticks = parse_steal_ticks(text) if text is not None else None
        return None if ticks is None else ticks / self._user_hz

    def throttled_seconds(self, pid: int) -> float | None:
        """CFS throttled seconds of the cgroup ``pid``'s ``cpu`` controller puts it in;
        ``None`` when the process is gone, its cgroup cannot be named or has no
        throttling statistics.

        ``/proc/<pid>/cgroup`` is read on every call (a process may move); the
        ``cpu.stat`` file its text leads to is remembered by that text (at most
        ``MAX_REMEMBERED_CGROUPS``), so the path is built and the folders tried once.
        """
        text = self._files.text(self._proc / f"{pid}/cgroup")
        if text is None:
            return None
        found = self._stat_files.get(text)
        if found is not None:
            stat = self._files.text(found[0])
            if stat is not None:
                return parse_throttled_seconds(stat, found[1])
            del self._stat_files[text]  # the cgroup went away: look again
        cgroup = cpu_cgroup(text)
        if cgroup is None:
            return None
        relative = cgroup.path.lstrip("/")
        if cgroup.version == 1:
            folders = [cgroup.controllers, "cpu"] if cgroup.controllers != "cpu" else ["cpu"]
        else:
            folders = ["", "unified"]
        for folder in folders:
            path = (self._cgroup_root / folder if folder else self._cgroup_root) / relative
            stat = self._files.text(path / "cpu.stat")
            if stat is not None:
                if len(self._stat_files) >= MAX_REMEMBERED_CGROUPS:
                    self._stat_files.clear()
                self._stat_files[text] = (path / "cpu.stat", cgroup.version)
                return parse_throttled_seconds(stat, cgroup.version)
        return None
