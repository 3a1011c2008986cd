"""Node health: one status per (subsystem, device), from the samples the node exports.

``HealthMonitor.evaluate`` reads the families the other collectors produced in
the same evaluation (GPU, network, InfiniBand, pressure, platform, Tencent) and
gives, for every (subsystem, device) the node has evidence for, the worst
reason that holds now: ``ok`` (severity 0, action ``none``) when none does.
``trainmon.collectors.health`` exports it as
``trainmon_health_status{subsystem,device,reason,action}`` = severity
(0 healthy, 1 degraded, 2 failed).

``REASONS`` is the one table of reasons: subsystem, code, severity, action and
meaning, in precedence order (of two reasons of one severity, the earlier
wins). docs/metrics.md ("Node health") prints it, and a test ties the two.
The thresholds are the ``collectors.health`` section (``HealthConfig``).

Kinds of evidence:

- **State now** (the latest samples): a GPU that stopped answering NVML, the
  driver's recovery action, rows or pages waiting for a reset, a PCIe link
  narrower than its maximum, an NVLink link down, fabric registration not
  complete, an InfiniBand port down, an open cloud event.
- **Recent events**: an XID within ``xid_recent_seconds`` (its
  ``trainmon_gpu_xid_last_timestamp_seconds`` against the wall clock).
- **Rates** over the snapshots of the last ``window_seconds`` (the time
  actually between the oldest kept snapshot and now, ``trainmon.diagnosis.samples.Window``):
  uncorrectable ECC errors, throttled GPU time, PCIe replays, NIC and
  InfiniBand errors, CPU pressure and steal. The first evaluation has no rate:
  these reasons need two evaluations.

Where a subsystem's series come from: ``gpu`` from ``trainmon_gpu_up``;
``gpu_memory`` from any ECC, remapped-row or retired-page sample of the GPU;
``pcie`` from its link width, generation or replay counter; ``nvlink`` from
``trainmon_gpu_nvlink_links_down``; ``fabric`` from ``trainmon_gpu_fabric_up``;
``network`` from the NIC's error counters; ``infiniband`` from the port's state
or error counters (device ``mlx5_0:1``); ``cpu`` (device ``node``) from the PSI
or steal counters; ``instance`` (device = the instance id) only where this
process holds both the node's ``trainmon_node_info{instance_id}`` and the
Tencent events puller's families. The puller usually runs as its own daemon,
so the node's ``instance`` series is then absent and the fleet rules join
``trainmon_tencent_event_info`` to ``trainmon_node_info`` on ``instance_id``
in Prometheus.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trainmon.core.families import Metric
from trainmon.diagnosis.samples import Labels, ScrapedSamples, Window
from trainmon.section import RATIO, setting

OK, DEGRADED, FAILED = 0, 1, 2
#: Values of the ``subsystem`` label, in export order.
SUBSYSTEMS: tuple[str, ...] = (
    "gpu", "gpu_memory", "pcie", "nvlink", "fabric", "network", "infiniband", "cpu", "instance",
)
#: Values of the ``action`` label, least to most disruptive.
ACTIONS: tuple[str, ...] = ("none", "restart_job", "reset_gpu", "reboot", "drain")


@dataclass(frozen=True)
class Reason:
    """One row of the reason table."""

    subsystem: str
    code: str
    severity: int
    action: str
    #: What it means, for docs/metrics.md.
    meaning: str


#: Every reason, in precedence order within a severity (docs/metrics.md prints this table).
REASONS: tuple[Reason, ...] = (
    Reason("gpu", "gpu_lost", FAILED, "reboot",
           "`trainmon_gpu_up` 0 and no reading of the GPU: it no longer answers NVML (fell "
           "off the bus, XID 79)"),
    Reason("gpu", "recovery_drain_and_reset", FAILED, "drain",
           "recovery action `drain_and_reset`: drain the node, then reset the GPU"),
    Reason("gpu", "recovery_reboot", FAILED, "reboot", "recovery action `reboot`"),
    Reason("gpu", "recovery_drain_p2p", FAILED, "drain",
           "recovery action `drain_p2p`: drain peer-to-peer traffic (NVLink) before a reset"),
    Reason("gpu", "recovery_recover_imex_domain", FAILED, "drain",
           "recovery action `recover_imex_domain`: the NVLink domain's IMEX daemons "
           "need recovery"),
    Reason("gpu", "recovery_reset_gpu", FAILED, "reset_gpu", "recovery action `reset_gpu`"),
    Reason("gpu", "recovery_unknown", DEGRADED, "none",
           "the driver asks for a recovery action newer than trainmon (`unknown`): "
           "`nvidia-smi -q` names it"),
    Reason("gpu", "recovery_restart_job", DEGRADED, "restart_job",
           "recovery action `restart_job`"),
    Reason("gpu", "xid_recent", DEGRADED, "restart_job",
           "an XID error within `xid_recent_seconds` (its last timestamp)"),
    Reason("gpu", "query_failed", DEGRADED, "none",
           "`trainmon_gpu_up` 0 while the GPU's other readings are there: a query failed "
           "unexpectedly (the daemon's log names it), not a lost GPU"),
    Reason("gpu", "thermal_throttle", DEGRADED, "none",
           "thermal throttling at least `gpu_throttle_ratio` of the window"),
    Reason("gpu", "reliability_throttle", DEGRADED, "none",
           "`board_limit` or `reliability` throttling at least `gpu_throttle_ratio` of "
           "the window"),
    Reason("gpu_memory", "row_remap_failed", FAILED, "drain",
           "`trainmon_gpu_row_remap_failed` 1: a row could not be remapped; replace the GPU"),
    Reason("gpu_memory", "ecc_uncorrectable", FAILED, "reset_gpu",
           "uncorrectable (volatile) ECC errors increased within the window"),
    Reason("gpu_memory", "row_remap_pending", DEGRADED, "reset_gpu",
           "`trainmon_gpu_row_remap_pending` 1: a remap takes effect at the next GPU reset"),
    Reason("gpu_memory", "retired_pages_pending", DEGRADED, "reset_gpu",
           "`trainmon_gpu_retired_pages_pending` 1: pages retire at the next reset"),
    Reason("pcie", "link_width_degraded", DEGRADED, "drain",
           "link width below its maximum (x16 → x8)"),
    Reason("pcie", "replay_rate", DEGRADED, "drain",
           "PCIe replays at least `pcie_replays_per_minute` over the window"),
    Reason("pcie", "link_generation_degraded", DEGRADED, "none",
           "link generation below its maximum while the GPU is at least "
           "`pcie_busy_utilization_ratio` busy (an idle GPU lowers it to save power)"),
    Reason("nvlink", "link_down", FAILED, "reset_gpu",
           "an NVLink link of the GPU is down (`trainmon_gpu_nvlink_links_down` above 0)"),
    Reason("fabric", "fabric_not_up", FAILED, "reboot",
           "NVSwitch fabric registration not completed with success "
           "(`trainmon_gpu_fabric_up` 0): CUDA cannot start"),
    Reason("network", "errors", DEGRADED, "drain",
           "receive + transmit errors at least `network_errors_per_second` over the window"),
    Reason("infiniband", "port_down", FAILED, "drain",
           "the port is not ACTIVE after this daemon saw it ACTIVE"),
    Reason("infiniband", "errors", DEGRADED, "drain",
           "port error counters (all of `trainmon_infiniband_errors_total`) at least "
           "`infiniband_errors_per_second` over the window"),
    Reason("infiniband", "port_inactive", DEGRADED, "none",
           "the port has not been ACTIVE since this daemon started (uncabled, or down at boot)"),
    Reason("cpu", "pressure", DEGRADED, "none",
           "PSI cpu `some` at least `cpu_pressure_ratio` of the window"),
    Reason("cpu", "steal", DEGRADED, "none",
           "steal time at least `cpu_steal_ratio` of the CPUs' time over the window"),
    Reason("instance", "gpu_fault", FAILED, "drain", "an open Tencent Cloud GPU fault event"),
    Reason("instance", "host_fault", FAILED, "drain", "an open Tencent Cloud host fault event"),
    Reason("instance", "maintenance", DEGRADED, "drain",
           "an open (scheduled) maintenance event: move the work before it starts"),
    Reason("instance", "migration", DEGRADED, "none", "an open migration event"),
    Reason("instance", "other_event", DEGRADED, "none", "another open Cloud Monitor event"),
)
_BY_CODE: dict[tuple[str, str], tuple[int, Reason]] = {
    (reason.subsystem, reason.code): (index, reason) for index, reason in enumerate(REASONS)
}
#: Recovery actions of ``trainmon_gpu_recovery_action{action}`` that are a reason.
RECOVERY_ACTIONS = ("restart_job", "reset_gpu", "reboot", "drain_p2p", "drain_and_reset",
                    "recover_imex_domain", "unknown")
#: Tencent event categories that are a reason of their own (the others: ``other_event``).
EVENT_CATEGORIES = ("gpu_fault", "host_fault", "maintenance", "migration")
#: GPU throttle reasons (``trainmon_gpu_throttle_seconds_total{reason}``) → health reason.
THROTTLE_REASONS: Mapping[str, str] = {
    "thermal": "thermal_throttle",
    "board_limit": "reliability_throttle",
    "reliability": "reliability_throttle",
}

#: Every sample name the health rules read (the snapshot keeps only these).
HEALTH_SAMPLES = frozenset({
    "trainmon_gpu_up", "trainmon_gpu_utilization_ratio", "trainmon_gpu_recovery_action",
    "trainmon_gpu_xid_last_timestamp_seconds", "trainmon_gpu_throttle_seconds_total",
    "trainmon_gpu_ecc_errors_total", "trainmon_gpu_remapped_rows",
    "trainmon_gpu_row_remap_pending", "trainmon_gpu_row_remap_failed",
    "trainmon_gpu_retired_pages", "trainmon_gpu_retired_pages_pending",
    "trainmon_gpu_pcie_link_width", "trainmon_gpu_pcie_link_max_width",
    "trainmon_gpu_pcie_link_generation", "trainmon_gpu_pcie_link_max_generation",
    "trainmon_gpu_pcie_replays_total", "trainmon_gpu_nvlink_links_down", "trainmon_gpu_fabric_up",
    "trainmon_network_receive_errors_total", "trainmon_network_transmit_errors_total",
    "trainmon_infiniband_port_up", "trainmon_infiniband_errors_total",
    "trainmon_node_pressure_seconds_total", "trainmon_node_cpu_steal_seconds_total",
    "trainmon_node_info", "trainmon_tencent_event_info",
})
#: Families of the Tencent events puller: present (even empty) where it runs in this process.
TENCENT_EVENT_FAMILIES = frozenset({
    "trainmon_tencent_event_info", "trainmon_tencent_events_skipped",
})
#: Snapshots kept per window (one every window / 20 at most, as the diagnosis keeps).
SNAPSHOTS_PER_WINDOW = 20
#: InfiniBand ports remembered as once ACTIVE (cleared when full).
MAX_REMEMBERED_PORTS = 1024


@dataclass(frozen=True)
class HealthConfig:
    """The ``collectors.health`` section: thresholds of ``trainmon_health_status``."""

    enabled: bool = True
    #: Span of the rate-based reasons: counters are compared over this many seconds;
    #: also the daemon's evaluation clock (every window / 20) where the diagnosis is off.
    window_seconds: float = field(default=60.0, metadata=setting(minimum=5, maximum=3600))
    #: An XID this recent (seconds) makes the GPU ``xid_recent``.
    xid_recent_seconds: float = field(
        default=3600.0, metadata=setting(minimum=60, maximum=7 * 86400))
    #: Share of the window a GPU spent thermally (or board-/reliability-) throttled.
    gpu_throttle_ratio: float = field(default=0.1, metadata=RATIO)
    #: PCIe replays per minute (DCGM's default PCIe replay-rate threshold is 8).
    pcie_replays_per_minute: float = field(
        default=8.0, metadata=setting(minimum=0, maximum=1e9))
    #: The link generation counts only while the GPU is at least this busy.
    pcie_busy_utilization_ratio: float = field(default=0.5, metadata=RATIO)
    #: NIC receive + transmit errors per second.
    network_errors_per_second: float = field(
        default=0.1, metadata=setting(minimum=0, maximum=1e9))
    #: InfiniBand port errors (all counters) per second.
    infiniband_errors_per_second: float = field(
        default=0.1, metadata=setting(minimum=0, maximum=1e9))
    #: PSI cpu ``some``: share of the window at least one task waited for a CPU.
    cpu_pressure_ratio: float = field(default=0.2, metadata=RATIO)
    #: Steal time / (window x CPUs).
    cpu_steal_ratio: float = field(default=0.05, metadata=RATIO)


@dataclass(frozen=True)
class HealthStatus:
    """The worst reason of one (subsystem, device) now."""

    subsystem: str
    device: str
    reason: str
    severity: int
    action: str


def reason(subsystem: str, code: str) -> Reason:
    """The row of ``REASONS`` for ``code`` of ``subsystem``; ``KeyError`` if none."""
    return _BY_CODE[(subsystem, code)][1]


def worst(subsystem: str, device: str, codes: Iterable[str]) -> HealthStatus:
    """The status of a device with these reasons: the highest severity, the earlier row
    of ``REASONS`` among equals; ``ok`` without any."""
    ranked = sorted((-_BY_CODE[(subsystem, code)][1].severity, _BY_CODE[(subsystem, code)][0])
                    for code in codes)
    if not ranked:
        return HealthStatus(subsystem, device, "ok", OK, "none")
    row = REASONS[ranked[0][1]]
    return HealthStatus(subsystem, device, row.code, row.severity, row.action)


class HealthMonitor:
    """Keeps the snapshots of the last window and judges each evaluation.

    ``cpu_count``: the host's CPUs (steal time is summed over them). State: at
    most ``SNAPSHOTS_PER_WINDOW + 2`` snapshots of ``HEALTH_SAMPLES`` and the
    InfiniBand ports seen ACTIVE.
    """

    def __init__(self, config: HealthConfig, cpu_count: int) -> None:
        self._config = config
        self._cpu_count = max(cpu_count, 1)
        self._spacing = config.window_seconds / SNAPSHOTS_PER_WINDOW
        self._snapshots: deque[ScrapedSamples] = deque(maxlen=SNAPSHOTS_PER_WINDOW + 2)
        self._ports_seen_up: set[str] = set()

    def evaluate(self, families: Sequence[Metric], at: float, wall: float) -> list[HealthStatus]:
        """The status of every (subsystem, device) with evidence in ``families``
        (monotonic time ``at``, Unix time ``wall``), in ``SUBSYSTEMS`` order, then by device."""
        current = ScrapedSamples.from_families(families, at, wall, HEALTH_SAMPLES)
        horizon = at - self._config.window_seconds
        while self._snapshots and self._snapshots[0].at < horizon:
            self._snapshots.popleft()
        window = Window([*self._snapshots, current])
        if not self._snapshots or at - self._snapshots[-1].at >= self._spacing:
            self._snapshots.append(current)
        events_known = any(family.name in TENCENT_EVENT_FAMILIES for family in families)
        found: dict[tuple[str, str], list[str]] = {}
        for subsystem, device, code in self._judge(window, events_known):
            codes = found.setdefault((subsystem, device), [])
            if code is not None:
                codes.append(code)
        order = {name: index for index, name in enumerate(SUBSYSTEMS)}
        return [worst(subsystem, device, codes)
                for (subsystem, device), codes in sorted(
                    found.items(), key=lambda item: (order[item[0][0]], _device_key(item[0][1])))]

    def _judge(self, window: Window,
               events_known: bool) -> Iterable[tuple[str, str, str | None]]:
        """(subsystem, device, reason code or None for "present") for every finding."""
        yield from self._gpu(window)
        yield from self._gpu_memory(window)
        yield from self._pcie(window)
        yield from self._links(window)
        yield from self._network(window)
        yield from self._infiniband(window)
        yield from self._cpu(window)
        if events_known:
            yield from _instance(window)

    def _gpu(self, window: Window) -> Iterable[tuple[str, str, str | None]]:
        config = self._config
        # a lost GPU keeps only trainmon_gpu_info and trainmon_gpu_up (docs/metrics.md)
        answering = {_label(labels, "gpu")
                     for labels in window.latest("trainmon_gpu_utilization_ratio")}
        for labels, up in window.latest("trainmon_gpu_up").items():
            gpu = _label(labels, "gpu")
            lost = "query_failed" if gpu in answering else "gpu_lost"
            yield "gpu", gpu, lost if up == 0 else None
        for labels, value in window.latest("trainmon_gpu_recovery_action").items():
            action = _label(labels, "action")
            if value == 1 and action in RECOVERY_ACTIONS:
                yield "gpu", _label(labels, "gpu"), f"recovery_{action}"
        for labels, last in window.latest("trainmon_gpu_xid_last_timestamp_seconds").items():
            if window.last.wall - last <= config.xid_recent_seconds:
                yield "gpu", _label(labels, "gpu"), "xid_recent"
        for labels in window.latest("trainmon_gpu_throttle_seconds_total"):
            code = THROTTLE_REASONS.get(_label(labels, "reason"))
            rate = window.rate("trainmon_gpu_throttle_seconds_total", labels) if code else None
            if code and rate is not None and rate >= config.gpu_throttle_ratio:
                yield "gpu", _label(labels, "gpu"), code

    def _gpu_memory(self, window: Window) -> Iterable[tuple[str, str, str | None]]:
        for name, code in (("trainmon_gpu_row_remap_failed", "row_remap_failed"),
                           ("trainmon_gpu_row_remap_pending", "row_remap_pending"),
                           ("trainmon_gpu_retired_pages_pending", "retired_pages_pending")):
            for labels, value in window.latest(name).items():
                yield "gpu_memory", _label(labels, "gpu"), code if value == 1 else None
        for name in ("trainmon_gpu_remapped_rows", "trainmon_gpu_retired_pages"):
            for labels in window.latest(name):
                yield "gpu_memory", _label(labels, "gpu"), None
        for labels in window.latest("trainmon_gpu_ecc_errors_total"):
            gpu = _label(labels, "gpu")
            increase = (window.increase("trainmon_gpu_ecc_errors_total", labels)
                        if _label(labels, "severity") == "uncorrected" else None)
            yield "gpu_memory", gpu, "ecc_uncorrectable" if increase and increase > 0 else None

    def _pcie(self, window: Window) -> Iterable[tuple[str, str, str | None]]:
        config = self._config
        busy = {_label(labels, "gpu") for labels, value
                in window.latest("trainmon_gpu_utilization_ratio").items()
                if value >= config.pcie_busy_utilization_ratio}
        for current, maximum, code, needs_busy in (
            ("trainmon_gpu_pcie_link_width", "trainmon_gpu_pcie_link_max_width",
             "link_width_degraded", False),
            ("trainmon_gpu_pcie_link_generation", "trainmon_gpu_pcie_link_max_generation",
             "link_generation_degraded", True),
        ):
            maxima = {_label(labels, "gpu"): value
                      for labels, value in window.latest(maximum).items()}
            for labels, value in window.latest(current).items():
                gpu = _label(labels, "gpu")
                top = maxima.get(gpu)
                below = top is not None and value < top and (gpu in busy or not needs_busy)
                yield "pcie", gpu, code if below else None
        for labels in window.latest("trainmon_gpu_pcie_replays_total"):
            rate = window.rate("trainmon_gpu_pcie_replays_total", labels)
            high = rate is not None and rate * 60 >= config.pcie_replays_per_minute
            yield "pcie", _label(labels, "gpu"), "replay_rate" if high else None

    @staticmethod
    def _links(window: Window) -> Iterable[tuple[str, str, str | None]]:
        for labels, down in window.latest("trainmon_gpu_nvlink_links_down").items():
            yield "nvlink", _label(labels, "gpu"), "link_down" if down > 0 else None
        for labels, up in window.latest("trainmon_gpu_fabric_up").items():
            yield "fabric", _label(labels, "gpu"), "fabric_not_up" if up == 0 else None

    def _network(self, window: Window) -> Iterable[tuple[str, str, str | None]]:
        rates: dict[str, float] = {}
        for name in ("trainmon_network_receive_errors_total",
                     "trainmon_network_transmit_errors_total"):
            for labels in window.latest(name):
                device = _label(labels, "device")
                rate = window.rate(name, labels)
                rates[device] = rates.get(device, 0.0) + (rate or 0.0)
        for device, rate in rates.items():
            high = rate >= self._config.network_errors_per_second and rate > 0
            yield "network", device, "errors" if high else None

    def _infiniband(self, window: Window) -> Iterable[tuple[str, str, str | None]]:
        for labels, up in window.latest("trainmon_infiniband_port_up").items():
            port = f"{_label(labels, 'device')}:{_label(labels, 'port')}"
            if up == 1:
                if len(self._ports_seen_up) >= MAX_REMEMBERED_PORTS:
                    self._ports_seen_up.clear()
                self._ports_seen_up.add(port)
                yield "infiniband", port, None
            else:
                yield "infiniband", port, (
                    "port_down" if port in self._ports_seen_up else "port_inactive")
        rates: dict[str, float] = {}
        for labels in window.latest("trainmon_infiniband_errors_total"):
            port = f"{_label(labels, 'device')}:{_label(labels, 'port')}"
            rate = window.rate("trainmon_infiniband_errors_total", labels)
            rates[port] = rates.get(port, 0.0) + (rate or 0.0)
        for port, rate in rates.items():
            high = rate >= self._config.infiniband_errors_per_second and rate > 0
            yield "infiniband", port, "errors" if high else None

    def _cpu(self, window: Window) -> Iterable[tuple[str, str, str | None]]:
        config = self._config
        for labels in window.latest("trainmon_node_pressure_seconds_total"):
            if _label(labels, "resource") == "cpu" and _label(labels, "scope") == "some":
                rate = window.rate("trainmon_node_pressure_seconds_total", labels)
                high = rate is not None and rate >= config.cpu_pressure_ratio
                yield "cpu", "node", "pressure" if high else None
        for labels in window.latest("trainmon_node_cpu_steal_seconds_total"):
            rate = window.rate("trainmon_node_cpu_steal_seconds_total", labels)
            high = rate is not None and rate / self._cpu_count >= config.cpu_steal_ratio
            yield "cpu", "node", "steal" if high else None


def _instance(window: Window) -> Iterable[tuple[str, str, str | None]]:
    """The node's own instance (``trainmon_node_info{instance_id}``) and its open events."""
    instances = {_label(labels, "instance_id") for labels in window.latest("trainmon_node_info")}
    instances.discard("")
    for instance in instances:
        yield "instance", instance, None
    for labels in window.latest("trainmon_tencent_event_info"):
        instance = _label(labels, "instance_id")
        if instance in instances:
            category = _label(labels, "category")
            yield "instance", instance, (
                category if category in EVENT_CATEGORIES else "other_event")


def _label(labels: Labels, name: str) -> str:
    for key, value in labels:
        if key == name:
            return value
    return ""


def _device_key(device: str) -> tuple[int, str]:
    """GPU indexes in numeric order, then names."""
    return (int(device), "") if device.isdigit() else (1 << 30, device)
