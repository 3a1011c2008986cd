"""``trainmon serve`` end to end on the fake libnvidia-ml.so.1, loaded the way a
user's machine loads the real one: through ``LD_LIBRARY_PATH``.

The fake's clock starts when the daemon loads the library (its first
``nvmlInit``), so scenario times are seconds after start-up.
"""

from __future__ import annotations

import ctypes.util
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import Scrape, parse

pytestmark = pytest.mark.integration

StartDaemon = Callable[..., Daemon]
CONFIG = {"collectors": {"gpu": {"retry_seconds": 1, "sample_interval_seconds": 0.5}}}
FAMILIES = [
    "trainmon_gpu_info",
    "trainmon_gpu_up",
    "trainmon_gpu_utilization_ratio",
    "trainmon_gpu_memory_used_bytes",
    "trainmon_gpu_memory_total_bytes",
    "trainmon_gpu_power_watts",
    "trainmon_gpu_power_limit_watts",
    "trainmon_gpu_energy_joules_total",
    "trainmon_gpu_temperature_celsius",
    "trainmon_gpu_sm_clock_hertz",
    "trainmon_gpu_throttle_seconds_total",
    "trainmon_gpu_pcie_transmit_bytes_total",
    "trainmon_gpu_pcie_receive_bytes_total",
    "trainmon_gpu_nvlink_transmit_bytes_total",
    "trainmon_gpu_nvlink_receive_bytes_total",
    "trainmon_gpu_xid_errors_total",
    "trainmon_gpu_xid_last_timestamp_seconds",
    "trainmon_gpu_ecc_errors_total",
    "trainmon_gpu_util_samples_total",
    "trainmon_gpu_util_idle_samples_total",
    "trainmon_gpu_util_transitions_total",
    "trainmon_gpu_sawtooth_ratio",
]
EIGHT = [str(index) for index in range(8)]


def scrape_until(
    daemon: Daemon, condition: Callable[[Scrape], bool], timeout: float = 20.0
) -> Scrape:
    deadline = time.monotonic() + timeout
    while True:
        result = parse(daemon.metrics())
        if condition(result):
            return result
        assert time.monotonic() < deadline, f"not reached in {timeout}s:\n{daemon.log()}"
        time.sleep(0.25)


def gpu_health(daemon: Daemon) -> dict[str, object]:
    status, body = daemon.get("/healthz")
    assert status == 200, body
    entry = json.loads(body)["collectors"]["gpu"]
    assert isinstance(entry, dict)
    return entry


def gpu_success(result: Scrape) -> float:
    return result.samples["trainmon_collector_success"][(("collector", "gpu"),)]


def test_eight_fake_gpus_end_to_end(
    start_daemon: StartDaemon, gpu_env: Callable[..., dict[str, str]]
) -> None:
    env = gpu_env(
        "gpus 8\nsteady * 95 2\nsquare 0 4 0.5 98 0\nsquare 1 4 0.5 98 0\n"
        "lost 3 10\nxid 1 2 79\nxid 1 3 79\n"
    )
    daemon = start_daemon(config=CONFIG, env=env)
    first = parse(daemon.metrics())
    assert gpu_success(first) == 1
    assert [name for name in FAMILIES if name not in first.samples] in (
        [],
        ["trainmon_gpu_xid_errors_total", "trainmon_gpu_xid_last_timestamp_seconds"],
    )
    assert first.by_gpu("trainmon_gpu_up") == dict.fromkeys(EIGHT, 1.0)
    assert first.by_gpu("trainmon_gpu_power_watts") == {str(i): 250 + i for i in range(8)}
    assert first.by_gpu("trainmon_gpu_memory_used_bytes") == {
        str(i): (i + 1) * 2**30 for i in range(8)
    }
    assert first.by_gpu("trainmon_gpu_throttle_seconds_total", reason="thermal") == {
        str(i): 2 * (i + 1) for i in range(8)
    }
    assert first.by_gpu("trainmon_gpu_utilization_ratio")["7"] == pytest.approx(0.95, abs=0.021)

    xids = scrape_until(daemon, lambda r: "trainmon_gpu_xid_errors_total" in r.samples)
    lost = scrape_until(daemon, lambda r: r.by_gpu("trainmon_gpu_up").get("3") == 0.0)
    assert all(name in lost.samples for name in FAMILIES)
    assert lost.samples["trainmon_gpu_xid_errors_total"] == {(("gpu", "1"), ("xid", "79")): 2.0}
    assert set(xids.samples["trainmon_gpu_xid_errors_total"].values()) <= {1.0, 2.0}
    assert lost.by_gpu("trainmon_gpu_up") == {**dict.fromkeys(EIGHT, 1.0), "3": 0.0}
    assert gpu_success(lost) == 1
    before = first.by_gpu("trainmon_gpu_energy_joules_total")
    after = lost.by_gpu("trainmon_gpu_energy_joules_total")
    assert set(after) == set(EIGHT) - {"3"}
    assert all(after[gpu] > before[gpu] for gpu in after)  # the others keep updating
    assert lost.by_gpu("trainmon_gpu_sawtooth_ratio")["0"] >= 0.5
    assert lost.by_gpu("trainmon_gpu_sawtooth_ratio")["7"] == 0.0
    assert gpu_health(daemon)["lost_gpus"] == [3]
    assert daemon.log().count("GPU 3 is lost") == 1


def test_without_the_nvml_library_the_gpu_collector_is_reported_unavailable(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real NVML library")
    daemon = start_daemon(config=CONFIG, env={"LD_LIBRARY_PATH": str(tmp_path)})
    result = parse(daemon.metrics())
    assert gpu_success(result) == 0
    assert not any(name.startswith("trainmon_gpu_") for name in result.samples)
    assert "trainmon_network_receive_bytes_total" in result.samples  # the rest goes on
    health = gpu_health(daemon)
    assert health["state"] == "unavailable"
    assert "libnvidia-ml.so.1 not found" in str(health["error"])
    assert daemon.process.poll() is None


def test_an_old_driver_loses_only_the_readings_it_lacks(
    start_daemon: StartDaemon,
    gpu_env: Callable[..., dict[str, str]],
    old_driver_dir: Path,
) -> None:
    scenario = "gpus 2\nfabric * 3 0\npcie_link 1 8 4 16 5\n"
    daemon = start_daemon(config=CONFIG, env=gpu_env(scenario, old_driver_dir))
    for _ in range(3):
        result = parse(daemon.metrics())
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}
    for name in ("trainmon_gpu_energy_joules_total", "trainmon_gpu_pcie_transmit_bytes_total"):
        assert name not in result.samples
    assert result.by_gpu("trainmon_gpu_power_watts") == {"0": 250, "1": 251}
    assert gpu_health(daemon)["xid_events"] == "unsupported"
    assert "trainmon_gpu_sm_active_ratio" not in result.samples
    assert gpu_health(daemon)["gpm"] == dict.fromkeys(
        ("0", "1"), "unsupported: nvmlGpmQueryDeviceSupport: NVML_ERROR_FUNCTION_NOT_FOUND"
    )
    # Driver health: the GPU's own max PCIe generation falls back to the link's,
    # the versioned fabric call to the unversioned one; no field values: no NVLink
    # link count (no trainmon_gpu_nvlink_links_down) and no driver recovery action.
    assert result.by_gpu("trainmon_gpu_pcie_link_width") == {"0": 16, "1": 8}
    assert result.by_gpu("trainmon_gpu_pcie_link_generation") == {"0": 5, "1": 4}
    assert result.by_gpu("trainmon_gpu_pcie_link_max_generation") == {"0": 5, "1": 5}
    assert result.by_gpu("trainmon_gpu_fabric_up") == {"0": 1, "1": 1}
    for name in ("trainmon_gpu_remapped_rows", "trainmon_gpu_nvlink_links_down"):
        assert name not in result.samples, name
    assert result.series("trainmon_gpu_recovery_action", "gpu", "action", "source") == {
        ("0", "none", "none"): 1.0,
        ("1", "none", "none"): 1.0,
    }
    log = daemon.log()
    for function in (
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetFieldValues",
        "nvmlGpmQueryDeviceSupport",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetGpuFabricInfoV",
    ):
        assert log.count(f"{function} is not in this NVIDIA driver's NVML") == 1, log


def test_a_driver_that_loads_late_is_picked_up(
    start_daemon: StartDaemon, gpu_env: Callable[..., dict[str, str]]
) -> None:
    daemon = start_daemon(config=CONFIG, env=gpu_env("gpus 2\ndriver_unloaded 0 3\n"))
    health = gpu_health(daemon)
    assert health["state"] == "unavailable", health
    assert "NVML_ERROR_DRIVER_NOT_LOADED" in str(health["error"])
    result = scrape_until(daemon, lambda r: gpu_success(r) == 1)
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}


def test_demo_mode_simulates_a_sawtoothing_job_on_gpus_0_to_3(start_daemon: StartDaemon) -> None:
    daemon = start_daemon(config=CONFIG, args=["--demo"], env={"LD_LIBRARY_PATH": "/nonexistent"})
    result = scrape_until(
        daemon, lambda r: len(r.by_gpu("trainmon_gpu_sawtooth_ratio")) == 8, timeout=10
    )
    ratio = result.by_gpu("trainmon_gpu_sawtooth_ratio")
    assert all(ratio[gpu] >= 0.5 for gpu in "0123"), ratio
    assert all(ratio[gpu] == 0.0 for gpu in "4567"), ratio
    utilization = result.by_gpu("trainmon_gpu_utilization_ratio")
    assert all(utilization[gpu] >= 0.9 for gpu in "4567"), utilization
    names = {dict(key)["name"] for key in result.samples["trainmon_gpu_info"]}
    assert names == {"NVIDIA H100 80GB HBM3 (simulated)"}
    build = result.samples["trainmon_build_info"]
    assert [dict(key)["mode"] for key in build] == ["demo"]


def test_demo_tensor_cores_are_busy_on_the_healthy_job_only_while_the_starved_one_idles(
    start_daemon: StartDaemon,
) -> None:
    daemon = start_daemon(config=CONFIG, args=["--demo"], env={"LD_LIBRARY_PATH": "/nonexistent"})
    result = scrape_until(
        daemon, lambda r: len(r.by_gpu("trainmon_gpu_sm_active_ratio")) == 8, timeout=10
    )
    sm = result.by_gpu("trainmon_gpu_sm_active_ratio")
    tensor = result.by_gpu("trainmon_gpu_tensor_active_ratio")
    assert all(0.7 <= sm[gpu] <= 0.9 for gpu in "4567"), sm
    assert all(0.5 <= tensor[gpu] <= 0.7 for gpu in "4567"), tensor
    assert all(sm[gpu] <= 0.9 for gpu in "0123"), sm
    pipes = result.series("trainmon_gpu_pipe_active_ratio", "gpu", "pipe")
    assert {pipe for gpu, pipe in pipes if gpu == "4"} == {
        "fp16",
        "fp32",
        "fp64",
        "tensor_hmma",
        "tensor_imma",
        "tensor_dfma",
    }
    starved_idle = []  # the sawtooth: over 10 s each starved GPU has idle intervals
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline and len(starved_idle) < 4:
        current = parse(daemon.metrics()).by_gpu("trainmon_gpu_sm_active_ratio")
        starved_idle = sorted({*starved_idle, *(g for g in "0123" if current.get(g, 1) < 0.3)})
        time.sleep(0.5)
    assert starved_idle == ["0", "1", "2", "3"], daemon.log()
