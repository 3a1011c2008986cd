"""GPU driver health over the real pynvml and the fake libnvidia-ml.so.1, in process.

Every signal of docs/metrics.md's "Driver health and the recovery action" is
driven by a scenario directive of the fake (testkit/fakenvml/README.md,
"Health"): the PCIe link and its replays, remapped rows, retired pages,
NVLink links, the NVSwitch fabric, the driver's recovery action and the XID
table behind it, the SM clock's maximum; a reading the GPU does not support is
left out, a lost GPU keeps only what it kept before (and the XID table's
action). The old driver (no field values, no row remapping, no versioned fabric
call) is covered by tests/gpu/test_gpu_serve.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from testkit.exposition import Scrape
from tests.gpu.gpu_support import Clock, FakeNVML, gpus, start_listening, wait_for
from trainmon.collectors.gpu import GPUCollector, GPUConfig
from trainmon.gpu import recovery
from trainmon.gpu.nvml import NVML

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
#: NVML calls of one scrape per GPU (docs/metrics.md, GPU: "20 per GPU").
CALLS_PER_SCRAPE = 20
#: Calls of one health refresh per GPU with a fabric, besides one per NVLink link
#: (docs/metrics.md; pynvml asks for the retired pages of each cause twice).
CALLS_PER_REFRESH = 10
HEALTH_GAUGES = (
    "trainmon_gpu_pcie_link_max_width",
    "trainmon_gpu_pcie_link_max_generation",
    "trainmon_gpu_sm_clock_max_hertz",
    "trainmon_gpu_row_remap_pending",
    "trainmon_gpu_row_remap_failed",
    "trainmon_gpu_retired_pages_pending",
)


def actions(result: Scrape) -> dict[str, tuple[str, str]]:
    """GPU → (action, source) of ``trainmon_gpu_recovery_action`` (one series per GPU)."""
    series = result.series("trainmon_gpu_recovery_action", "gpu", "action", "source")
    assert set(series.values()) <= {1.0}
    by_gpu = {gpu: (action, source) for gpu, action, source in series}
    assert len(by_gpu) == len(series), series
    return by_gpu


def test_a_healthy_gpu_reads_healthy_in_every_family(
    scenario: Callable[[str], Path],
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 2\nfabric * 3 0\n")
    result = scrape(make_collector())

    assert result.types["trainmon_gpu_pcie_replays_total"] == "counter"
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}
    expected = {
        "trainmon_gpu_pcie_link_width": 16,
        "trainmon_gpu_pcie_link_max_width": 16,
        "trainmon_gpu_pcie_link_generation": 5,
        "trainmon_gpu_pcie_link_max_generation": 5,
        "trainmon_gpu_pcie_replays_total": 0,
        "trainmon_gpu_row_remap_pending": 0,
        "trainmon_gpu_row_remap_failed": 0,
        "trainmon_gpu_retired_pages_pending": 0,
        "trainmon_gpu_fabric_up": 1,
        "trainmon_gpu_sm_clock_max_hertz": 1980e6,
    }
    for name, value in expected.items():
        assert result.by_gpu(name) == dict.fromkeys(gpus(2), value), name
    for cause in ("correctable", "uncorrectable"):
        assert result.by_gpu("trainmon_gpu_remapped_rows", cause=cause) == {"0": 0, "1": 0}
    for cause in ("single_bit", "double_bit"):
        assert result.by_gpu("trainmon_gpu_retired_pages", cause=cause) == {"0": 0, "1": 0}
    assert result.by_gpu("trainmon_gpu_nvlink_links_down") == dict.fromkeys(gpus(2), 0)
    assert actions(result) == dict.fromkeys(gpus(2), ("none", "driver"))


def test_each_fault_shows_on_its_own_gpu(
    scenario: Callable[[str], Path],
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario(
        "gpus 8\n"
        "pcie_link 1 8 3 16 5\n"  # x16 Gen5 trained down to x8 Gen3
        "pcie_replays 2 4242\n"
        "remapped_rows 3 4 1 1 0\n"  # a remap waits for a reset
        "remapped_rows 4 0 9 0 1\n"  # out of spare rows
        "retired_pages 5 2 1 1\n"
        "nvlink 6 18 3,17\n"
        "fabric * 3 0\nfabric 7 2 0\nfabric 0 3 5\n"  # 7 in progress, 0 completed but failed
        "recovery_action 3 1\nrecovery_action 4 4\n"
        "max_clock 2 1755\n"
    )
    result = scrape(make_collector())

    healthy = dict.fromkeys(gpus(8), 1.0)
    assert result.by_gpu("trainmon_gpu_up") == healthy
    assert result.by_gpu("trainmon_gpu_pcie_link_width") == {**dict.fromkeys(gpus(8), 16), "1": 8}
    assert result.by_gpu("trainmon_gpu_pcie_link_generation") == {
        **dict.fromkeys(gpus(8), 5),
        "1": 3,
    }
    assert result.by_gpu("trainmon_gpu_pcie_link_max_width") == dict.fromkeys(gpus(8), 16)
    assert result.by_gpu("trainmon_gpu_pcie_link_max_generation") == dict.fromkeys(gpus(8), 5)
    assert result.by_gpu("trainmon_gpu_pcie_replays_total") == {
        **dict.fromkeys(gpus(8), 0),
        "2": 4242,
    }
    assert result.series("trainmon_gpu_remapped_rows", "gpu", "cause") == {
        **{(gpu, cause): 0.0 for gpu in gpus(8) for cause in ("correctable", "uncorrectable")},
        ("3", "correctable"): 4.0,
        ("3", "uncorrectable"): 1.0,
        ("4", "uncorrectable"): 9.0,
    }
    assert result.by_gpu("trainmon_gpu_row_remap_pending") == {**dict.fromkeys(gpus(8), 0), "3": 1}
    assert result.by_gpu("trainmon_gpu_row_remap_failed") == {**dict.fromkeys(gpus(8), 0), "4": 1}
    assert result.series("trainmon_gpu_retired_pages", "gpu", "cause") == {
        **{(gpu, cause): 0.0 for gpu in gpus(8) for cause in ("single_bit", "double_bit")},
        ("5", "single_bit"): 2.0,
        ("5", "double_bit"): 1.0,
    }
    assert result.by_gpu("trainmon_gpu_retired_pages_pending") == {
        **dict.fromkeys(gpus(8), 0),
        "5": 1,
    }
    assert result.by_gpu("trainmon_gpu_nvlink_links_down") == {**dict.fromkeys(gpus(8), 0),
                                                                "6": 2}
    assert result.by_gpu("trainmon_gpu_fabric_up") == {**healthy, "0": 0.0, "7": 0.0}
    assert actions(result) == {
        **dict.fromkeys(gpus(8), ("none", "driver")),
        "3": ("reset_gpu", "driver"),
        "4": ("drain_and_reset", "driver"),
    }
    assert result.by_gpu("trainmon_gpu_sm_clock_max_hertz") == {
        **dict.fromkeys(gpus(8), 1980e6),
        "2": 1755e6,
    }


def test_readings_the_gpu_does_not_support_are_left_out(
    scenario: Callable[[str], Path],
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    unsupported = (
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetMaxClockInfo",
    )
    scenario(
        "gpus 3\n"
        + "".join(f"unsupported 0 {function}\n" for function in unsupported)
        + "nvlink 0 0\nunsupported_field 0 230\n"  # a PCIe card on an older driver
        + "failing 2 nvmlDeviceGetRemappedRows\n"
    )
    result = scrape(make_collector())

    every_health_family = (
        *HEALTH_GAUGES,
        "trainmon_gpu_pcie_link_width",
        "trainmon_gpu_pcie_link_generation",
        "trainmon_gpu_pcie_replays_total",
        "trainmon_gpu_remapped_rows",
        "trainmon_gpu_retired_pages",
    )
    for name in every_health_family:
        assert "0" not in result.by_gpu(name), name
        assert "1" in result.by_gpu(name), name
    assert set(result.by_gpu("trainmon_gpu_nvlink_links_down")) == {"1", "2"}
    assert "trainmon_gpu_fabric_up" not in result.samples  # no GPU has a fabric here
    # Not supported is no failure; an unexpected error is, and leaves its reading out.
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0, "2": 0.0}
    for name in ("trainmon_gpu_remapped_rows", "trainmon_gpu_row_remap_pending"):
        assert set(result.by_gpu(name)) == {"1"}, name
    assert actions(result) == {
        "0": ("none", "none"),
        "1": ("none", "driver"),
        "2": ("none", "driver"),
    }


def test_the_xid_table_stands_in_for_the_driver_and_forgets_after_an_hour(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    clock: Clock,
    scrape: Callable[..., Scrape],
) -> None:
    # GPU 0 and 1: a driver without the recovery field; 2: the field says none;
    # 3: the field says reboot. XIDs at 2 s: 13 and 79 on GPU 1, 13 on GPU 2 and 3.
    scenario(
        "gpus 4\nunsupported_field 0 230\nunsupported_field 1 230\nrecovery_action 3 2\n"
        "xid 1 2 13\nxid 1 2 79\nxid 2 2 13\nxid 3 2 13\n"
    )
    fake_nvml.set_time(1.0)
    wall = Clock()
    collector = GPUCollector(NVML(clock=clock), GPUConfig(), clock=clock, wall_clock=wall)
    try:
        start_listening(collector)
        fake_nvml.set_time(3.0)
        wait_for(lambda: len(collector.xid.counts()) == 4)
        assert actions(scrape(collector)) == {
            "0": ("none", "none"),
            "1": ("reboot", "xid_table"),  # the most disruptive of its XIDs
            "2": ("restart_job", "xid_table"),  # the driver's none does not hide the XID
            "3": ("reboot", "driver"),
        }
        clock.now += recovery.XID_LOOKBACK_SECONDS + 1  # an XID's age is monotonic time
        wall.now += recovery.XID_LOOKBACK_SECONDS + 1
        assert actions(scrape(collector)) == {
            "0": ("none", "none"),
            "1": ("none", "none"),
            "2": ("none", "driver"),
            "3": ("reboot", "driver"),
        }
    finally:
        collector.stop()


def test_a_lost_gpu_keeps_only_the_xid_tables_action(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 3\nxid 1 4 79\nlost 1 5\n")
    fake_nvml.set_time(1.0)
    collector = start_listening(make_collector())
    before = scrape(collector)
    assert set(before.by_gpu("trainmon_gpu_remapped_rows", cause="correctable")) == {"0", "1", "2"}

    fake_nvml.set_time(6.0)
    wait_for(lambda: len(collector.xid.counts()) == 1)
    after = scrape(collector)
    assert after.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 0.0, "2": 1.0}
    for name in (*HEALTH_GAUGES, "trainmon_gpu_pcie_link_width", "trainmon_gpu_pcie_replays_total"):
        assert set(after.by_gpu(name)) == {"0", "2"}, name
    assert set(after.by_gpu("trainmon_gpu_nvlink_links_down")) == {"0", "2"}
    assert actions(after) == {
        "0": ("none", "driver"),
        "1": ("reboot", "xid_table"),  # XID 79: fallen off the bus
        "2": ("none", "driver"),
    }


def test_slow_readings_are_read_once_per_health_interval(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    clock: Clock,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 2\nnvlink 1 0\nfabric * 3 0\n")  # GPU 0 has 18 NVLink links, GPU 1 none
    collector = make_collector(health_interval_seconds=30.0)
    scrape(collector)  # opens the session, reads the link counts once

    def calls_of_one_scrape() -> int:
        before = fake_nvml.calls()
        scrape(collector)
        return fake_nvml.calls() - before

    clock.now += 30.0
    refreshed = calls_of_one_scrape()
    cached = calls_of_one_scrape()
    clock.now += 29.0
    still_cached = calls_of_one_scrape()
    assert cached == still_cached == 2 * CALLS_PER_SCRAPE
    assert refreshed == cached + 2 * CALLS_PER_REFRESH + 18


@pytest.mark.parametrize(
    ("code", "action"),
    [
        ("NVML_GPU_RECOVERY_ACTION_NONE", "none"),
        ("NVML_GPU_RECOVERY_ACTION_GPU_RESET", "reset_gpu"),
        ("NVML_GPU_RECOVERY_ACTION_NODE_REBOOT", "reboot"),
        ("NVML_GPU_RECOVERY_ACTION_DRAIN_P2P", "drain_p2p"),
        ("NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", "drain_and_reset"),
        ("NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN", "recover_imex_domain"),
        ("NVML_GPU_RECOVERY_ACTION_BUS_RESET", "reset_gpu"),
        ("NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT", "reboot"),
    ],
)
def test_every_driver_action_of_pynvml_has_its_label(
    code: str,
    action: str,
    scenario: Callable[[str], Path],
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario(f"gpus 1\nrecovery_action 0 {getattr(pynvml, code)}\n")
    assert actions(scrape(make_collector())) == {"0": (action, "driver")}


def test_a_driver_action_newer_than_trainmon_is_unknown_and_every_code_is_mapped() -> None:
    assert recovery.recommended_action(99, [13]) == ("unknown", "driver")
    codes = {
        value
        for name, value in vars(pynvml).items()
        if name.startswith("NVML_GPU_RECOVERY_ACTION_") and isinstance(value, int)
    }
    assert codes == set(recovery.DRIVER_ACTIONS)
    assert set(recovery.DRIVER_ACTIONS.values()) | set(recovery.XID_ACTIONS.values()) <= set(
        recovery.ACTIONS
    )


def test_the_documented_xid_table_is_the_one_in_recovery_py() -> None:
    section = METRICS_DOC.read_text().split("### Driver health and the recovery action")[1]
    documented: dict[int, str] = {}
    for xids, action in re.findall(r"^\| ([\d, ]+) \| [^|]+ \| `(\w+)`", section, re.MULTILINE):
        for xid in xids.split(","):
            documented[int(xid)] = action
    assert documented == dict(recovery.XID_ACTIONS)
