"""trainmon_health_status from the real GPU collector on the fake libnvidia-ml.so.1.

The GPU collector and the health collector run in one registry, as in the
daemon; each fault is a scenario directive of the fake (testkit/fakenvml/README.md,
"Health"), and the health gauge must name it on its GPU with the reason and
action of the table in ``trainmon.diagnosis.health``. The fake's ECC and
violation (throttle) counters are fixed functions of the GPU index, so
``ecc_uncorrectable``, ``thermal_throttle`` and ``reliability_throttle`` are
driven from families in tests/diagnosis/test_health.py only; the replay rate is
driven here by switching scenarios between two evaluations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml

from testkit.exposition import scrape
from tests.gpu.gpu_support import Clock, FakeNVML, wait_for
from trainmon.collectors.gpu import GPUCollector, GPUConfig
from trainmon.collectors.health import HealthCollector
from trainmon.core.registry import CollectorRegistry
from trainmon.diagnosis.health import RECOVERY_ACTIONS, HealthConfig
from trainmon.gpu import recovery
from trainmon.gpu.nvml import NVML

#: (subsystem, device) -> (reason, action, value).
Statuses = dict[tuple[str, str], tuple[str, str, float]]


def evaluate(registry: CollectorRegistry) -> Statuses:
    registry.evaluate()
    statuses: Statuses = {}
    for labels, value in scrape(registry).samples.get("trainmon_health_status", {}).items():
        found = dict(labels)
        statuses[(found["subsystem"], found["device"])] = (found["reason"], found["action"],
                                                          value)
    return statuses


def not_ok(statuses: Statuses) -> Statuses:
    return {key: status for key, status in statuses.items() if status[0] != "ok"}


def node(clock: Clock, *, window_seconds: float = 60.0) -> tuple[GPUCollector, HealthCollector,
                                                                 CollectorRegistry]:
    gpu = GPUCollector(NVML(clock=clock), GPUConfig(), clock=clock)
    health = HealthCollector(HealthConfig(window_seconds=window_seconds), cpu_count=8,
                             clock=clock)
    return gpu, health, CollectorRegistry([gpu, health], clock=clock)


def test_every_exported_recovery_action_is_a_health_reason() -> None:
    exported = {*recovery.ACTIONS, *recovery.DRIVER_ACTIONS.values(),
                recovery.UNKNOWN_DRIVER_ACTION} - {"none"}
    assert exported == set(RECOVERY_ACTIONS)


def test_each_driver_fault_is_named_on_its_gpu(
    scenario: Callable[[str], Path], clock: Clock
) -> None:
    scenario(
        "gpus 8\nsteady * 90 0\nfabric * 3 0\n"
        "pcie_link 0 8 5 16 5\n"  # x16 trained down to x8
        "pcie_link 1 16 3 16 5\n"  # Gen5 running Gen3 while busy
        "remapped_rows 2 0 1 1 0\n"  # a remap waits for a reset
        "remapped_rows 3 0 9 0 1\n"  # out of spare rows
        "retired_pages 4 2 1 1\n"  # a page waits to retire
        "nvlink 5 18 3\n"  # link 3 down
        "fabric 6 2 0\n"  # registration still in progress
        "recovery_action 7 1\n"  # the driver asks for a GPU reset
    )
    gpu, _, registry = node(clock)
    try:
        gpu.start()  # the utilization sampler: the link generation counts on a busy GPU
        wait_for(lambda: len(scrape(gpu).by_gpu("trainmon_gpu_utilization_ratio")) == 8)
        statuses = evaluate(registry)
    finally:
        gpu.stop()
    assert not_ok(statuses) == {
        ("pcie", "0"): ("link_width_degraded", "drain", 1.0),
        ("pcie", "1"): ("link_generation_degraded", "none", 1.0),
        ("gpu_memory", "2"): ("row_remap_pending", "reset_gpu", 1.0),
        ("gpu_memory", "3"): ("row_remap_failed", "drain", 2.0),
        ("gpu_memory", "4"): ("retired_pages_pending", "reset_gpu", 1.0),
        ("nvlink", "5"): ("link_down", "reset_gpu", 2.0),
        ("fabric", "6"): ("fabric_not_up", "reboot", 2.0),
        ("gpu", "7"): ("recovery_reset_gpu", "reset_gpu", 2.0),
    }
    # every subsystem has an unhealthy GPU: only those are exported (no ok series)
    assert set(statuses) == set(not_ok(statuses))


def test_recovery_actions_xids_and_a_lost_gpu(
    scenario: Callable[[str], Path], fake_nvml: FakeNVML, clock: Clock
) -> None:
    scenario(
        "gpus 7\n"
        "recovery_action 0 2\nrecovery_action 1 3\nrecovery_action 2 4\nrecovery_action 3 5\n"
        "recovery_action 4 99\n"  # newer than trainmon
        "xid 5 2 13\n"  # the XID table: restart the job
        "xid 6 2 154\n"  # an XID the table does not list: recent, no action from the table
        "lost 6 4\n"
    )
    fake_nvml.set_time(1.0)
    gpu, _, registry = node(clock)
    try:
        gpu.start()
        wait_for(lambda: gpu.xid.state == "listening")
        fake_nvml.set_time(3.0)
        wait_for(lambda: len(gpu.xid.counts()) == 2)
        assert not_ok(evaluate(registry)) == {
            ("gpu", "0"): ("recovery_reboot", "reboot", 2.0),
            ("gpu", "1"): ("recovery_drain_p2p", "drain", 2.0),
            ("gpu", "2"): ("recovery_drain_and_reset", "drain", 2.0),
            ("gpu", "3"): ("recovery_recover_imex_domain", "drain", 2.0),
            ("gpu", "4"): ("recovery_unknown", "none", 1.0),
            ("gpu", "5"): ("recovery_restart_job", "restart_job", 1.0),
            ("gpu", "6"): ("xid_recent", "restart_job", 1.0),
        }
        fake_nvml.set_time(5.0)  # GPU 6 falls off the bus
        statuses = evaluate(registry)
        assert statuses[("gpu", "6")] == ("gpu_lost", "reboot", 2.0)
        # a lost GPU keeps only its gpu series: its other subsystems are judged on none
        assert all(device != "6" for subsystem, device in statuses if subsystem != "gpu")
    finally:
        gpu.stop()


def test_a_replay_rate_needs_two_evaluations(
    scenario: Callable[[str], Path], clock: Clock
) -> None:
    scenario("gpus 2\npcie_replays 1 10\n")
    # the GPU collector re-reads replays every health_interval_seconds (60 s): a window
    # longer than that holds two readings
    gpu, _, registry = node(clock, window_seconds=300.0)
    try:
        assert not_ok(evaluate(registry)) == {}
        scenario("gpus 2\npcie_replays 1 70\n")
        pynvml.nvmlInit()  # the fake reads the new scenario at the next nvmlInit
        pynvml.nvmlShutdown()
        clock.now += GPUConfig().health_interval_seconds + 1
        statuses = evaluate(registry)
    finally:
        gpu.stop()
    assert not_ok(statuses) == {("pcie", "1"): ("replay_rate", "drain", 1.0)}
