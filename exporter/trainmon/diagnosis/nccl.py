"""NCCL sanity checks: a training process's ``NCCL_*`` environment against the node.

Sources:

- the process environment (``/proc/<pid>/environ``, read by
  ``trainmon.attribution``; only with the same user or ``CAP_SYS_PTRACE``);
- the RDMA ports of the node: ``<sys>/class/infiniband/<hca>/ports/<n>/state``
  (``4: ACTIVE``) and ``link_layer`` (``InfiniBand``, or ``Ethernet`` for RoCE,
  which NCCL drives through the same IB verbs transport);
- the network interfaces the *process* sees: ``<proc>/<pid>/net/dev`` (its own
  network namespace, which differs from the daemon's in a pod without
  ``hostNetwork``), else ``<sys>/class/net``.

Problems (the ``problem`` label of ``trainmon_nccl_problem_info``):

=============================  ==========================================================
``ib_disabled_with_rdma``      ``NCCL_IB_DISABLE`` is non-zero while an RDMA port is
                               ACTIVE: gradients go over TCP sockets instead
``socket_ifname_not_found``    an entry of an include-list ``NCCL_SOCKET_IFNAME`` matches
                               no interface of the process
``ib_hca_not_found``           an entry of an include-list ``NCCL_IB_HCA`` matches no HCA
                               (or no such port)
``no_rdma_ib_enabled``         a distributed process (``NCCL_*``, ``MASTER_ADDR`` or
                               ``WORLD_SIZE`` > 1 in its environment) on a node without an
                               ACTIVE RDMA port and IB not disabled: NCCL probes IB, finds
                               nothing and silently falls back to sockets
``debug_logging``              ``NCCL_DEBUG`` is ``INFO`` or ``TRACE``: verbose logging on
                               every rank, meant for debugging sessions
=============================  ==========================================================

List syntax (NCCL's ``parseStringList`` and ``matchIfList``, used by both
``NCCL_SOCKET_IFNAME`` and ``NCCL_IB_HCA``): comma-separated entries; a
leading ``^`` makes the whole list an exclude list; then a leading ``=`` makes
every entry an exact name instead of a prefix; each entry may end in
``:<port>`` (HCA port; ignored for interfaces). Exclude lists never name a
problem: excluding something absent is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainmon.node.infiniband import infiniband_ports, port_active
from trainmon.node.kernelfiles import KernelFileReader
from trainmon.node.netdev import parse_net_dev

log = logging.getLogger(__name__)

#: Longest ``value`` label exported (characters); longer values are cut.
MAX_VALUE_LENGTH = 128
_VERBOSE_DEBUG = ("INFO", "TRACE")


@dataclass(frozen=True)
class RdmaPort:
    """One port of an InfiniBand or RoCE HCA."""

    device: str
    port: int
    active: bool
    link_layer: str


@dataclass(frozen=True)
class NcclProblem:
    """One misconfiguration found in a process environment."""

    problem: str
    #: The environment variable at fault (``NCCL_IB_DISABLE``…).
    variable: str
    #: Its value, cut to ``MAX_VALUE_LENGTH``; empty when the variable is unset.
    value: str
    #: The names the check was made against, for humans (``doctor``).
    detail: str


@dataclass(frozen=True)
class DeviceList:
    """A parsed ``NCCL_SOCKET_IFNAME`` / ``NCCL_IB_HCA`` value."""

    exclude: bool
    exact: bool
    #: ``(name or prefix, port or None)`` per entry.
    entries: tuple[tuple[str, int | None], ...]

    def entry_matches(self, entry: tuple[str, int | None], name: str, port: int | None) -> bool:
        prefix, wanted_port = entry
        named = name == prefix if self.exact else name.startswith(prefix)
        return named and (wanted_port is None or port is None or wanted_port == port)


def parse_device_list(value: str) -> DeviceList:
    """Parse NCCL's ``[^][=]name[:port][,name[:port]...]`` syntax."""
    text = value.strip()
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    entries: list[tuple[str, int | None]] = []
    for raw in text.split(","):
        name, separator, port_text = raw.strip().partition(":")
        if not name:
            continue
        port = int(port_text) if separator and port_text.strip().isdigit() else None
        entries.append((name, port))
    return DeviceList(exclude, exact, tuple(entries))


def read_rdma_ports(sys_root: Path, files: KernelFileReader | None = None) -> tuple[RdmaPort, ...]:
    """Every port under ``<sys>/class/infiniband``; empty when the class is absent."""
    files = files or KernelFileReader(log)
    return tuple(
        RdmaPort(
            device=device,
            port=int(port),
            active=port_active(files.text(directory / "state") or ""),
            link_layer=files.text(directory / "link_layer") or "",
        )
        for device, port, directory in infiniband_ports(sys_root)
        if port.isdigit()
    )


def read_interfaces(proc_root: Path, pid: int, sys_root: Path) -> frozenset[str]:
    """Interface names in ``pid``'s network namespace (``/proc/<pid>/net/dev``).

    Falls back to ``<sys>/class/net`` (the daemon's namespace) when the
    process's file cannot be read.
    """
    try:
        text = (proc_root / str(pid) / "net" / "dev").read_text(errors="replace")
    except OSError:
        try:
            return frozenset(path.name for path in (sys_root / "class" / "net").iterdir())
        except OSError:
            return frozenset()
    return frozenset(name for name in parse_net_dev(text) if name)


def check_environment(
    environ: Mapping[str, str],
    rdma_ports: tuple[RdmaPort, ...],
    interfaces: frozenset[str],
) -> list[NcclProblem]:
    """The problems of one process environment, in the order the checks run here."""
    problems: list[NcclProblem] = []
    active = [port for port in rdma_ports if port.active]
    active_names = ", ".join(f"{port.device}:{port.port}" for port in active)
    ib_disable = environ.get("NCCL_IB_DISABLE")
    ib_disabled = _nonzero(ib_disable)
    if ib_disabled and active:
        problems.append(_problem("ib_disabled_with_rdma", environ, "NCCL_IB_DISABLE",
                                 f"active RDMA ports: {active_names}"))
    ifname = environ.get("NCCL_SOCKET_IFNAME")
    if ifname is not None and _names_missing(ifname, [(name, None) for name in interfaces]):
        problems.append(_problem("socket_ifname_not_found", environ, "NCCL_SOCKET_IFNAME",
                                 "interfaces: " + (", ".join(sorted(interfaces)) or "none")))
    hca = environ.get("NCCL_IB_HCA")
    if hca is not None and _names_missing(hca, [(p.device, p.port) for p in rdma_ports]):
        known = ", ".join(f"{port.device}:{port.port}" for port in rdma_ports) or "none"
        problems.append(_problem("ib_hca_not_found", environ, "NCCL_IB_HCA", f"HCA ports: {known}"))
    if not active and not ib_disabled and _distributed(environ):
        problems.append(_problem("no_rdma_ib_enabled", environ, "NCCL_IB_DISABLE",
                                 "no ACTIVE port under /sys/class/infiniband"))
    debug = environ.get("NCCL_DEBUG", "").strip().upper()
    if debug in _VERBOSE_DEBUG:
        problems.append(_problem("debug_logging", environ, "NCCL_DEBUG", f"level {debug}"))
    return problems


def _names_missing(value: str, devices: list[tuple[str, int | None]]) -> bool:
    """True when an include list has an entry that matches none of ``devices``."""
    parsed = parse_device_list(value)
    if parsed.exclude:
        return False
    return any(
        not any(parsed.entry_matches(entry, name, port) for name, port in devices)
        for entry in parsed.entries
    )


def _distributed(environ: Mapping[str, str]) -> bool:
    if "MASTER_ADDR" in environ or any(name.startswith("NCCL_") for name in environ):
        return True
    try:
        return int(environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def _nonzero(value: str | None) -> bool:
    """NCCL reads integer parameters with ``strtoll``; anything else is its default, 0."""
    if value is None:
        return False
    try:
        return int(value.strip()) != 0
    except ValueError:
        return False


def _problem(problem: str, environ: Mapping[str, str], variable: str, detail: str) -> NcclProblem:
    value = environ.get(variable, "")[:MAX_VALUE_LENGTH]
    return NcclProblem(problem, variable, value, detail)
