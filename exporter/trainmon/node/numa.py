"""NUMA topology of GPUs and the CPU affinity of processes, from sysfs and procfs.

The article's §4.3 case: a data loader or training process pinned (by
``taskset``, ``numactl``, a container's cpuset, or the scheduler's first
choice) to the CPU socket *far* from its GPU pays a cross-socket hop for every
host-to-device copy. Three files tell it:

- ``<sys>/bus/pci/devices/<bus id>/numa_node``: the GPU's NUMA node, a decimal
  integer. The kernel prints ``-1`` (``NUMA_NO_NODE``) when the firmware gave
  the device no proximity domain — the rule on virtualised hosts, where the
  hypervisor hides the topology. ``-1`` means *unknown*, never "node 0".
- ``<sys>/devices/system/node/node<N>/cpulist``: the CPUs of node ``N``.
- ``<proc>/<pid>/status``, line ``Cpus_allowed_list``: the CPUs the process may
  run on (its affinity mask, container cpuset included).

CPU lists are the kernel's list format (``bitmap_parselist``, the format of
``lib/bitmap.c``): comma-separated single CPUs and ranges, ``0-15,32-47``; the
kernel also accepts the group form ``a-b:used/group`` (``0-31:2/4`` = the
first 2 of every 4 CPUs in 0-31), which it never prints but a hand-written
file may hold; both are parsed. ``N`` (the last CPU, accepted by newer kernels
as input only) has no meaning in a file read back, and anything else that does
not parse raises ``ValueError`` with the offending text.

Bus ids: NVML reports ``00000000:3B:00.0`` (8 hex digits of PCI domain, upper
case; ``busIdLegacy`` has 4), sysfs names ``0000:3b:00.0`` (at least 4 digits,
lower case). ``sysfs_bus_id`` turns either into the sysfs name.

The GPU side (bus id → node → node CPUs) is static while the machine runs and
is cached by ``NumaTopology``; process affinity changes (``taskset -p``) and is
read on every call. Readers return ``None`` for anything they cannot tell;
they never raise on a vanished process or a missing file.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from trainmon.node.kernelfiles import KernelFileReader

log = logging.getLogger(__name__)

#: The kernel's ``NUMA_NO_NODE``, printed by ``numa_node`` when the node is unknown.
NO_NODE = -1

_BUS_ID = re.compile(
    r"(?:(?P<domain>[0-9A-Fa-f]{1,8}):)?(?P<bus>[0-9A-Fa-f]{1,2}):"
    r"(?P<device>[0-9A-Fa-f]{1,2})\.(?P<function>[0-7])"
)
_GROUP = re.compile(r"(?P<first>\d+)(?:-(?P<last>\d+)(?::(?P<used>\d+)/(?P<size>\d+))?)?")
_ALLOWED_PREFIX = "Cpus_allowed_list:"
#: Parsed affinity lists remembered by text (cleared when full).
MAX_REMEMBERED_MASKS = 256


def sysfs_bus_id(bus_id: str) -> str:
    """The sysfs device name of a PCI bus id: ``00000000:3B:00.0`` → ``0000:3b:00.0``.

    Accepts NVML's 8-digit and legacy 4-digit domains and a missing domain
    (``3b:00.0``, domain 0). Raises ``ValueError`` for anything else.
    """
    match = _BUS_ID.fullmatch(bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id (domain:bus:device.function): {bus_id!r}")
    domain = int(match.group("domain") or "0", 16)
    bus, device = int(match.group("bus"), 16), int(match.group("device"), 16)
    return f"{domain:04x}:{bus:02x}:{device:02x}.{match.group('function')}"


def parse_cpulist(text: str) -> frozenset[int]:
    """The CPUs of a kernel CPU list (``0-15,32-47``, ``0-31:2/4``); empty text → empty set.

    Raises ``ValueError`` naming the group that does not parse (``N``, reversed
    ranges, a group size of 0 or smaller than its used part).
    """
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for group in text.split(","):
        match = _GROUP.fullmatch(group.strip())
        if match is None:
            raise ValueError(f"not a CPU list group: {group!r} in {text[:80]!r}")
        first = int(match.group("first"))
        last = int(match.group("last") or first)
        used = int(match.group("used") or 1)
        size = int(match.group("size") or 1)
        if last < first or size == 0 or used == 0 or used > size:
            raise ValueError(f"invalid CPU list group: {group!r} in {text[:80]!r}")
        if used == size:  # a plain range (the only form the kernel prints)
            cpus.update(range(first, last + 1))
            continue
        for start in range(first, last + 1, size):
            cpus.update(range(start, min(start + used, last + 1)))
    return frozenset(cpus)


def allowed_cpus(status_text: str) -> frozenset[int] | None:
    """The ``Cpus_allowed_list`` of a ``/proc/<pid>/status`` text; ``None`` without one."""
    listed = allowed_cpulist(status_text)
    return None if listed is None else parse_cpulist(listed)


def allowed_cpulist(status_text: str) -> str | None:
    """The unparsed ``Cpus_allowed_list`` value of a ``/proc/<pid>/status`` text."""
    start = status_text.find(_ALLOWED_PREFIX)
    if start < 0 or (start > 0 and status_text[start - 1] != "\n"):
        return None
    end = status_text.find("\n", start)
    return status_text[start + len(_ALLOWED_PREFIX) : end if end >= 0 else None].strip()


class NumaTopology:
    """GPU and process NUMA facts under one ``/proc`` and ``/sys`` root.

    ``proc_root`` must show the *host's* pid namespace (a bare-metal daemon,
    or a DaemonSet with ``hostPID`` / ``/host/proc``): the pids come from NVML,
    which reports host pids, as in ``trainmon.collectors.attribution``.
    """

    def __init__(self, proc_root: Path, sys_root: Path) -> None:
        self._proc = proc_root
        self._sys = sys_root
        self._files = KernelFileReader(log)
        self._gpu_nodes: dict[str, int | None] = {}
        self._node_cpus: dict[int, frozenset[int] | None] = {}
        self._online: frozenset[int] | None = None
        self._online_read = False
        self._parsed: dict[str, frozenset[int] | None] = {}
        self._ratios: dict[tuple[int, frozenset[int]], float | None] = {}

    def gpu_node(self, bus_id: str) -> int | None:
        """The NUMA node of the PCI device ``bus_id`` (any case or domain width);
        ``NO_NODE`` (-1) as the kernel reports it; ``None`` when the device or its
        ``numa_node`` file is absent or the bus id is malformed. Cached."""
        if bus_id not in self._gpu_nodes:
            self._gpu_nodes[bus_id] = self._read_gpu_node(bus_id)
        return self._gpu_nodes[bus_id]

    def node_cpus(self, node: int) -> frozenset[int] | None:
        """The CPUs of NUMA node ``node``; ``None`` for ``NO_NODE`` or a missing or
        unparsable ``cpulist``. Cached."""
        if node < 0:
            return None
        if node not in self._node_cpus:
            self._node_cpus[node] = self._read_cpulist(
                self._sys / "devices" / "system" / "node" / f"node{node}" / "cpulist"
            )
        return self._node_cpus[node]

    def online_cpus(self) -> frozenset[int] | None:
        """Every CPU of every NUMA node (the union of the ``node*/cpulist``); ``None``
        when ``<sys>/devices/system/node`` has no node. Read once."""
        if not self._online_read:
            self._online_read = True
            try:
                nodes = [
                    int(entry.name[4:])
                    for entry in (self._sys / "devices" / "system" / "node").iterdir()
                    if entry.name.startswith("node") and entry.name[4:].isdigit()
                ]
            except (FileNotFoundError, NotADirectoryError):
                nodes = []
            cpus: set[int] = set()
            for node in nodes:
                cpus |= self.node_cpus(node) or frozenset()
            self._online = frozenset(cpus) if cpus else None
        return self._online

    def process_allowed_cpus(self, pid: int) -> frozenset[int] | None:
        """``Cpus_allowed_list`` of ``pid``, read now; ``None`` when the process is
        gone, the file is unreadable or holds no (valid) list."""
        path = self._proc / str(pid) / "status"
        text = self._files.text(path)  # None when the process exited after NVML listed it
        listed = allowed_cpulist(text) if text is not None else None
        if listed is None:
            return None
        if listed not in self._parsed:  # processes of one job share a handful of masks
            if len(self._parsed) >= MAX_REMEMBERED_MASKS:
                self._parsed.clear()
            try:
                self._parsed[listed] = parse_cpulist(listed)
            except ValueError as error:
                log.debug("%s: %s", path, error)  # once per distinct bad list
                self._parsed[listed] = None
        return self._parsed[listed]

    def local_ratio(self, bus_id: str, pid: int) -> float | None:
        """Share (0-1) of ``pid``'s allowed CPUs that lie on the NUMA node of the GPU
        at ``bus_id``; ``None`` when the topology or the process is unknown.

        Allowed CPUs that belong to no node (possible but offline CPUs, which
        a default mask includes) are left out of the denominator. A GPU on a
        node without CPUs gives ``None`` too: no binding could be local.
        """
        node = self.gpu_node(bus_id)
        local = self.node_cpus(node) if node is not None else None
        if not local:  # unknown, or a CPU-less (memory-only) node: nothing to be local to
            return None
        allowed = self.process_allowed_cpus(pid)
        if allowed is None or node is None:
            return None
        key = (node, allowed)
        if key not in self._ratios:
            if len(self._ratios) >= MAX_REMEMBERED_MASKS:
                self._ratios.clear()
            online = self.online_cpus()
            usable = allowed & online if online is not None else allowed
            self._ratios[key] = len(usable & local) / len(usable) if usable else None
        return self._ratios[key]

    def _read_gpu_node(self, bus_id: str) -> int | None:
        try:
            name = sysfs_bus_id(bus_id)
        except ValueError as error:
            log.warning("%s; its NUMA node is not read", error)
            return None
        return self._files.integer(self._sys / "bus" / "pci" / "devices" / name / "numa_node")

    def _read_cpulist(self, path: Path) -> frozenset[int] | None:
        text = self._files.text(path)
        if text is None:
            return None
        try:
            return parse_cpulist(text)
        except ValueError as error:
            log.warning("%s: %s; the node's CPUs are unknown", path, error)
            return None
