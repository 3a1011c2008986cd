"""trainmon_health_status: every reason driven from the families a node exports.

``Node`` holds one node's readings (two GPUs, a NIC, an InfiniBand port, PSI and
steal, its instance and the Tencent events puller) and builds the families the
source collectors would export from them; a test changes a reading, advances
the clocks and shows the families to the health collector, as the registry's
evaluation does. Rate-based reasons take two evaluations. The last tests run the
real network, InfiniBand and pressure collectors on fixture trees through a
registry.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from testkit.exposition import scrape
from tests.training.training_support import FakeClock
from trainmon.collectors.health import HealthCollector
from trainmon.collectors.infiniband import InfinibandCollector
from trainmon.collectors.network import NetworkCollector, NetworkConfig
from trainmon.collectors.pressure import PressureCollector
from trainmon.core.registry import CollectorRegistry
from trainmon.diagnosis.health import ACTIONS, REASONS, SUBSYSTEMS, HealthConfig
from trainmon.section import ConfigError, Section, read_section

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
NODE_FIXTURES = Path(__file__).resolve().parents[1] / "node" / "fixtures"
WALL = 1_800_000_000.0
INSTANCE = "ins-7x2k9q"
#: Seconds between two evaluations in these tests (the window is the default 60 s).
STEP = 10.0
#: Every (subsystem, device) of a ``Node``.
NODE_DEVICES = {
    ("gpu", "0"), ("gpu", "1"), ("gpu_memory", "0"), ("gpu_memory", "1"),
    ("pcie", "0"), ("pcie", "1"), ("nvlink", "0"), ("nvlink", "1"),
    ("fabric", "0"), ("fabric", "1"), ("network", "eth0"), ("infiniband", "mlx5_0:1"),
    ("cpu", "node"), ("instance", INSTANCE),
}
GPUS = ("0", "1")
#: What a healthy node exports: one ok series (device "") per subsystem it has.
HEALTHY_SERIES = {(subsystem, "") for subsystem, _ in NODE_DEVICES}
#: (subsystem, device) -> (reason, action, value) as exported.
Statuses = dict[tuple[str, str], tuple[str, str, float]]


@dataclass
class Node:
    """One node's readings; counters are cumulative, gauges current."""

    up: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 1.0))
    utilization: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 0.9))
    recovery: dict[str, tuple[str, str]] = field(
        default_factory=lambda: dict.fromkeys(GPUS, ("none", "none")))
    #: gpu -> Unix time of its last XID (none by default).
    xid_last: dict[str, float] = field(default_factory=dict)
    #: (gpu, reason) -> throttled seconds.
    throttle: dict[tuple[str, str], float] = field(default_factory=lambda: {
        (gpu, reason): 5.0 for gpu in GPUS
        for reason in ("power", "thermal", "board_limit", "reliability")})
    ecc: dict[tuple[str, str], float] = field(default_factory=lambda: {
        (gpu, severity): 2.0 for gpu in GPUS for severity in ("corrected", "uncorrected")})
    remap_pending: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 0.0))
    remap_failed: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 0.0))
    pages_pending: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 0.0))
    width: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 16.0))
    generation: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 5.0))
    replays: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 3.0))
    #: gpu -> NVLink links down.
    nvlink_down: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 0.0))
    fabric: dict[str, float] = field(default_factory=lambda: dict.fromkeys(GPUS, 1.0))
    nic_errors: dict[str, float] = field(
        default_factory=lambda: {"receive": 4.0, "transmit": 1.0})
    port_up: float = 1.0
    ib_errors: dict[str, float] = field(
        default_factory=lambda: {"symbol": 9.0, "link_downed": 1.0})
    cpu_pressure: float = 1000.0
    steal: float = 50.0
    #: (instance, event, category) of the open events the puller exports.
    events: list[tuple[str, str, str]] = field(default_factory=list)
    tencent_puller: bool = True

    def families(self) -> list[Metric]:
        g, c = GaugeMetricFamily, CounterMetricFamily
        out: list[Metric] = []

        def gauge(name: str, labels: list[str], values: dict[tuple[str, ...], float]) -> None:
            family = g(name, "test", labels=labels)
            for key, value in values.items():
                family.add_metric(list(key), value)
            out.append(family)

        def counter(name: str, labels: list[str],
                    values: dict[tuple[str, ...], float]) -> None:
            family = c(name, "test", labels=labels)
            for key, value in values.items():
                family.add_metric(list(key), value)
            out.append(family)

        per_gpu = lambda values: {(gpu,): value for gpu, value in values.items()}  # noqa: E731
        gauge("trainmon_gpu_up", ["gpu"], per_gpu(self.up))
        gauge("trainmon_gpu_utilization_ratio", ["gpu"], per_gpu(self.utilization))
        gauge("trainmon_gpu_recovery_action", ["gpu", "action", "source"],
              {(gpu, action, source): 1.0 for gpu, (action, source) in self.recovery.items()})
        gauge("trainmon_gpu_xid_last_timestamp_seconds", ["gpu", "xid"],
              {(gpu, "79"): at for gpu, at in self.xid_last.items()})
        counter("trainmon_gpu_throttle_seconds_total", ["gpu", "reason"], dict(self.throttle))
        counter("trainmon_gpu_ecc_errors_total", ["gpu", "severity"], dict(self.ecc))
        gauge("trainmon_gpu_remapped_rows", ["gpu", "cause"],
              {(gpu, "uncorrectable"): 0.0 for gpu in GPUS})
        gauge("trainmon_gpu_row_remap_pending", ["gpu"], per_gpu(self.remap_pending))
        gauge("trainmon_gpu_row_remap_failed", ["gpu"], per_gpu(self.remap_failed))
        gauge("trainmon_gpu_retired_pages_pending", ["gpu"], per_gpu(self.pages_pending))
        gauge("trainmon_gpu_pcie_link_width", ["gpu"], per_gpu(self.width))
        gauge("trainmon_gpu_pcie_link_max_width", ["gpu"], per_gpu(dict.fromkeys(GPUS, 16.0)))
        gauge("trainmon_gpu_pcie_link_generation", ["gpu"], per_gpu(self.generation))
        gauge("trainmon_gpu_pcie_link_max_generation", ["gpu"],
              per_gpu(dict.fromkeys(GPUS, 5.0)))
        counter("trainmon_gpu_pcie_replays_total", ["gpu"], per_gpu(self.replays))
        gauge("trainmon_gpu_nvlink_links_down", ["gpu"], per_gpu(self.nvlink_down))
        gauge("trainmon_gpu_fabric_up", ["gpu"], per_gpu(self.fabric))
        counter("trainmon_network_receive_errors_total", ["device"],
                {("eth0",): self.nic_errors["receive"]})
        counter("trainmon_network_transmit_errors_total", ["device"],
                {("eth0",): self.nic_errors["transmit"]})
        gauge("trainmon_infiniband_port_up", ["device", "port"], {("mlx5_0", "1"): self.port_up})
        counter("trainmon_infiniband_errors_total", ["device", "port", "counter"],
                {("mlx5_0", "1", name): value for name, value in self.ib_errors.items()})
        counter("trainmon_node_pressure_seconds_total", ["resource", "scope"],
                {("cpu", "some"): self.cpu_pressure, ("io", "some"): 7.0})
        counter("trainmon_node_cpu_steal_seconds_total", [], {(): self.steal})
        gauge("trainmon_node_info", ["provider", "instance_id"], {("tencent", INSTANCE): 1.0})
        if self.tencent_puller:
            if self.events:
                gauge("trainmon_tencent_event_info",
                      ["instance_id", "event", "category", "status"],
                      {(instance, event, category, "alarm"): 1.0
                       for instance, event, category in self.events})
            counter("trainmon_tencent_events_skipped_total", [], {(): 0.0})
        return out


class Evaluations:
    """A health collector with injected clocks, shown a ``Node`` as the registry would."""

    def __init__(self, config: HealthConfig | None = None, cpu_count: int = 8) -> None:
        self.clock = FakeClock(5000.0)
        self.wall = WALL
        self.collector = HealthCollector(config or HealthConfig(), cpu_count=cpu_count,
                                         clock=self.clock, wall_clock=lambda: self.wall)

    def evaluate(self, node: Node, *, after: float = STEP) -> Statuses:
        """Advance the clocks by ``after`` s, evaluate, and return (subsystem, device) →
        (reason, action, value) as exported."""
        self.clock.advance(after)
        self.wall += after
        self.collector.observe(node.families())
        result = scrape(self.collector)
        statuses = {}
        for labels, value in result.samples.get("trainmon_health_status", {}).items():
            found = dict(labels)
            key = (found["subsystem"], found["device"])
            assert key not in statuses, f"two series for {key}"
            statuses[key] = (found["reason"], found["action"], value)
        return statuses


def not_ok(statuses: Statuses) -> Statuses:
    return {key: status for key, status in statuses.items() if status[0] != "ok"}


def exported_series(unhealthy: Statuses) -> set[tuple[str, str]]:
    """The (subsystem, device) series of a node with these unhealthy devices: each of
    them, and one ok series for every subsystem without one."""
    named = {subsystem for subsystem, _ in unhealthy}
    return set(unhealthy) | {key for key in HEALTHY_SERIES if key[0] not in named}


@pytest.fixture
def health() -> Evaluations:
    return Evaluations()


# -- a healthy node -------------------------------------------------------------------


def test_a_healthy_node_is_all_ok_over_evaluations(health: Evaluations) -> None:
    node = Node()
    for _ in range(4):
        statuses = health.evaluate(node)
        assert set(statuses) == HEALTHY_SERIES
        assert set(statuses.values()) == {("ok", "none", 0.0)}
        node.cpu_pressure += STEP * 0.05  # some pressure, under the threshold
        node.steal += STEP * 8 * 0.01
        for key in node.throttle:
            node.throttle[key] += STEP * 0.05
        node.replays["0"] += 1  # 6 a minute
    assert health.collector.health() == {"unhealthy": []}


# -- reasons of the state now: one evaluation -----------------------------------------


@pytest.mark.parametrize(("change", "expected"), [
    # a lost GPU keeps only its info and up series
    (lambda n: (n.up.update({"1": 0.0}), n.utilization.pop("1")),
     {("gpu", "1"): ("gpu_lost", "reboot", 2.0)}),
    (lambda n: n.up.update({"1": 0.0}), {("gpu", "1"): ("query_failed", "none", 1.0)}),
    (lambda n: n.recovery.update({"0": ("reset_gpu", "driver")}),
     {("gpu", "0"): ("recovery_reset_gpu", "reset_gpu", 2.0)}),
    (lambda n: n.recovery.update({"0": ("reboot", "driver")}),
     {("gpu", "0"): ("recovery_reboot", "reboot", 2.0)}),
    (lambda n: n.recovery.update({"0": ("drain_p2p", "driver")}),
     {("gpu", "0"): ("recovery_drain_p2p", "drain", 2.0)}),
    (lambda n: n.recovery.update({"0": ("drain_and_reset", "driver")}),
     {("gpu", "0"): ("recovery_drain_and_reset", "drain", 2.0)}),
    (lambda n: n.recovery.update({"0": ("recover_imex_domain", "driver")}),
     {("gpu", "0"): ("recovery_recover_imex_domain", "drain", 2.0)}),
    (lambda n: n.recovery.update({"0": ("unknown", "driver")}),
     {("gpu", "0"): ("recovery_unknown", "none", 1.0)}),
    (lambda n: n.recovery.update({"1": ("restart_job", "xid_table")}),
     {("gpu", "1"): ("recovery_restart_job", "restart_job", 1.0)}),
    (lambda n: n.xid_last.update({"0": WALL - 600}),
     {("gpu", "0"): ("xid_recent", "restart_job", 1.0)}),
    (lambda n: n.remap_failed.update({"0": 1.0}),
     {("gpu_memory", "0"): ("row_remap_failed", "drain", 2.0)}),
    (lambda n: n.remap_pending.update({"1": 1.0}),
     {("gpu_memory", "1"): ("row_remap_pending", "reset_gpu", 1.0)}),
    (lambda n: n.pages_pending.update({"1": 1.0}),
     {("gpu_memory", "1"): ("retired_pages_pending", "reset_gpu", 1.0)}),
    (lambda n: n.width.update({"0": 8.0}),
     {("pcie", "0"): ("link_width_degraded", "drain", 1.0)}),
    (lambda n: n.generation.update({"0": 3.0}),
     {("pcie", "0"): ("link_generation_degraded", "none", 1.0)}),
    # an idle GPU lowers its link generation to save power: not a reason
    (lambda n: (n.generation.update({"0": 1.0}), n.utilization.update({"0": 0.0})), {}),
    (lambda n: n.nvlink_down.update({"1": 1.0}),
     {("nvlink", "1"): ("link_down", "reset_gpu", 2.0)}),
    (lambda n: n.fabric.update({"0": 0.0}),
     {("fabric", "0"): ("fabric_not_up", "reboot", 2.0)}),
    (lambda n: n.events.append((INSTANCE, "GPUFault", "gpu_fault")),
     {("instance", INSTANCE): ("gpu_fault", "drain", 2.0)}),
    (lambda n: n.events.append((INSTANCE, "HostFault", "host_fault")),
     {("instance", INSTANCE): ("host_fault", "drain", 2.0)}),
    (lambda n: n.events.append((INSTANCE, "InstanceMaintenance", "maintenance")),
     {("instance", INSTANCE): ("maintenance", "drain", 1.0)}),
    (lambda n: n.events.append((INSTANCE, "LiveMigration", "migration")),
     {("instance", INSTANCE): ("migration", "none", 1.0)}),
    (lambda n: n.events.append((INSTANCE, "DiskReadonly", "other")),
     {("instance", INSTANCE): ("other_event", "none", 1.0)}),
    # another instance's event is not this node's
    (lambda n: n.events.append(("ins-other", "GPUFault", "gpu_fault")), {}),
], ids=lambda value: "" if callable(value) else str(next(iter(value.values()), ("ok",))[0]))
def test_a_state_reason_shows_at_the_first_evaluation(
    health: Evaluations, change: object, expected: Statuses
) -> None:
    node = Node()
    change(node)  # type: ignore[operator]
    statuses = health.evaluate(node)
    assert set(statuses) == exported_series(expected)
    assert not_ok(statuses) == expected


def test_an_old_xid_is_not_recent(health: Evaluations) -> None:
    node = Node(xid_last={"0": WALL - 7200})
    assert not_ok(health.evaluate(node)) == {}


def test_a_port_that_was_active_is_down_one_never_active_is_inactive() -> None:
    never = Evaluations()
    assert not_ok(never.evaluate(Node(port_up=0.0))) == {
        ("infiniband", "mlx5_0:1"): ("port_inactive", "none", 1.0)}
    seen = Evaluations()
    node = Node()
    assert not_ok(seen.evaluate(node)) == {}
    node.port_up = 0.0
    assert not_ok(seen.evaluate(node)) == {
        ("infiniband", "mlx5_0:1"): ("port_down", "drain", 2.0)}


# -- rate-based reasons: two evaluations ------------------------------------------------


def bump(node: Node, reason: str) -> None:
    """Advance one counter of ``node`` by STEP seconds' worth at well above its threshold."""
    if reason in ("thermal_throttle", "reliability_throttle"):
        throttle = "thermal" if reason == "thermal_throttle" else "board_limit"
        node.throttle[("1", throttle)] += STEP * 0.5
    elif reason == "ecc_uncorrectable":
        node.ecc[("0", "uncorrected")] += 1
    elif reason == "replay_rate":
        node.replays["1"] += 5  # 30 a minute
    elif reason == "network_errors":
        node.nic_errors["receive"] += 5  # 0.5/s
    elif reason == "infiniband_errors":
        node.ib_errors["symbol"] += 20
    elif reason == "cpu_pressure":
        node.cpu_pressure += STEP * 0.6
    elif reason == "cpu_steal":
        node.steal += STEP * 8 * 0.2  # a fifth of 8 CPUs
    else:
        raise AssertionError(reason)


RATE_REASONS = {
    "thermal_throttle": {("gpu", "1"): ("thermal_throttle", "none", 1.0)},
    "reliability_throttle": {("gpu", "1"): ("reliability_throttle", "none", 1.0)},
    "ecc_uncorrectable": {("gpu_memory", "0"): ("ecc_uncorrectable", "reset_gpu", 2.0)},
    "replay_rate": {("pcie", "1"): ("replay_rate", "drain", 1.0)},
    "network_errors": {("network", "eth0"): ("errors", "drain", 1.0)},
    "infiniband_errors": {("infiniband", "mlx5_0:1"): ("errors", "drain", 1.0)},
    "cpu_pressure": {("cpu", "node"): ("pressure", "none", 1.0)},
    "cpu_steal": {("cpu", "node"): ("steal", "none", 1.0)},
}


@pytest.mark.parametrize("reason", list(RATE_REASONS))
def test_a_rate_reason_needs_two_evaluations_and_clears_after_the_window(
    health: Evaluations, reason: str
) -> None:
    node = Node()
    bump(node, reason)  # a jump before the first evaluation is no rate
    assert not_ok(health.evaluate(node)) == {}
    bump(node, reason)
    assert not_ok(health.evaluate(node)) == RATE_REASONS[reason]
    # counters still: once the window (60 s) has passed over the increase, healthy again
    statuses: Statuses = {}
    for _ in range(int(HealthConfig().window_seconds / STEP) + 1):
        statuses = health.evaluate(node)
    assert not_ok(statuses) == {}


def test_rates_are_taken_over_the_time_actually_measured(health: Evaluations) -> None:
    """Half an interval at 0.3 stall share reads 0.3, not 0.15: the span is measured."""
    node = Node()
    health.evaluate(node)
    node.cpu_pressure += 0.3 * STEP / 2
    assert not_ok(health.evaluate(node, after=STEP / 2)) == RATE_REASONS["cpu_pressure"]


# -- the worst reason wins; where there is no evidence, there is no series ---------------


def test_the_worst_reason_wins_and_the_earlier_row_among_equals(health: Evaluations) -> None:
    node = Node(xid_last={"0": WALL - 60, "1": WALL - 60})
    node.up["0"] = 0.0
    del node.utilization["0"]  # lost
    node.recovery["1"] = ("reset_gpu", "xid_table")
    node.remap_pending["1"] = 1.0
    node.pages_pending["1"] = 1.0
    statuses = not_ok(health.evaluate(node))
    assert statuses[("gpu", "0")] == ("gpu_lost", "reboot", 2.0)
    assert statuses[("gpu", "1")] == ("recovery_reset_gpu", "reset_gpu", 2.0)
    assert statuses[("gpu_memory", "1")] == ("row_remap_pending", "reset_gpu", 1.0)
    assert health.collector.health() == {"unhealthy": [
        "gpu/0: gpu_lost", "gpu/1: recovery_reset_gpu", "gpu_memory/1: row_remap_pending"]}


def test_the_instance_needs_the_tencent_puller_in_this_process(health: Evaluations) -> None:
    """Where the puller runs as its own daemon, the node has no instance series (the fleet
    rules join its events on instance_id in Prometheus)."""
    node = Node(tencent_puller=False, events=[(INSTANCE, "GPUFault", "gpu_fault")])
    assert set(health.evaluate(node)) == HEALTHY_SERIES - {("instance", "")}


def test_a_node_without_sources_exports_no_series(health: Evaluations) -> None:
    health.collector.observe([])
    assert scrape(health.collector).samples == {}


# -- one home: the reason table and the configuration are documented ----------------------


def doc_section(title: str) -> str:
    text = METRICS_DOC.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_reason_table_is_documented_as_the_code_has_it() -> None:
    rows = []
    for line in doc_section("Node health").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"`[a-z_]+`", cells[0]) and cells[2][:1].isdigit():
            rows.append((cells[0].strip("`"), cells[1].strip("`"), int(cells[2][0]),
                         cells[3].strip("`"), cells[4]))
    assert rows == [(r.subsystem, r.code, r.severity, r.action, r.meaning) for r in REASONS]
    assert {r.subsystem for r in REASONS} == set(SUBSYSTEMS)
    assert {r.action for r in REASONS} <= set(ACTIONS)


def test_the_configuration_is_documented_with_its_defaults() -> None:
    documented = {}
    configuration = doc_section("Node health").split("Configuration (`collectors.health`)")[1]
    for line in configuration.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[1] not in ("default", "---"):
            documented[cells[0].strip("`")] = cells[1]
    defaults = HealthConfig()
    assert set(documented) == {spec.name for spec in fields(HealthConfig)}
    for name, text in documented.items():
        value = getattr(defaults, name)
        assert (text == "true") if isinstance(value, bool) else float(text) == value, name


@pytest.mark.parametrize(("key", "value"), [
    ("window_seconds", 1), ("cpu_pressure_ratio", 1.5), ("network_errors_per_second", -1),
])
def test_thresholds_out_of_bounds_are_refused(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"collectors.health.{key}"):
        read_section(HealthConfig, Section({key: value}, "collectors.health", {}))


# -- real collectors through the registry -----------------------------------------------


@pytest.fixture
def node_tree(tmp_path: Path) -> Iterator[Path]:
    """A writable copy of the kernel-5.15 tree with the PSI host's pressure and stat."""
    root = Path(shutil.copytree(NODE_FIXTURES / "kernel-5.15", tmp_path / "node"))
    shutil.copytree(NODE_FIXTURES / "pressure-host" / "proc" / "pressure",
                    root / "proc" / "pressure")
    shutil.copy(NODE_FIXTURES / "pressure-host" / "proc" / "stat", root / "proc" / "stat")
    yield root


def test_registry_evaluations_judge_the_real_collectors_families(node_tree: Path) -> None:
    clock = FakeClock(100.0)
    health = HealthCollector(HealthConfig(), cpu_count=2, clock=clock, wall_clock=lambda: WALL)
    sources = [
        NetworkCollector(NetworkConfig(), node_tree / "proc", node_tree / "sys"),
        InfinibandCollector(node_tree / "sys"),
        PressureCollector(node_tree / "proc", node_tree / "sys", None, user_hz=100),
    ]
    registry = CollectorRegistry([*sources, health], clock=clock)
    registry.evaluate()
    statuses = {(s["subsystem"], s["device"]): s["reason"]
                for s in scrape(registry).labelsets("trainmon_health_status")}
    assert statuses == {
        ("network", ""): "ok", ("infiniband", "mlx5_0:2"): "port_inactive", ("cpu", ""): "ok",
    }
    # eth0 gains 50 receive errors and the CPU stalls half of the next 10 s
    net_dev = node_tree / "proc" / "net" / "dev"
    net_dev.write_text(net_dev.read_text().replace(
        "98765432    3    5", "98765432   53    5"))
    pressure = node_tree / "proc" / "pressure" / "cpu"
    pressure.write_text(pressure.read_text().replace("total=123456789", "total=128456789"))
    clock.advance(10.0)
    registry.evaluate()
    statuses = {(s["subsystem"], s["device"]): s["reason"]
                for s in scrape(registry).labelsets("trainmon_health_status")}
    assert statuses == {
        ("network", "eth0"): "errors", ("infiniband", "mlx5_0:2"): "port_inactive",
        ("cpu", "node"): "pressure",
    }
