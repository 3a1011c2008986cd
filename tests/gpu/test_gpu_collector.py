"""GPUCollector over the real pynvml and the fake libnvidia-ml.so.1, in process.

The fake's clock is frozen by each test (``fake_nvml.set_time``), so every
value is known exactly; the formulas are in ``fakenvml/README.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import Scrape
from tests.gpu.gpu_support import Clock, FakeNVML, gpus, start_listening, wait_for
from trainmon.collectors.gpu import GPUCollector
from trainmon.gpu.sampler import FLAG_THRESHOLD
from trainmon.gpu.types import GPUProcess, NVMLUnavailable

EIGHT_GPUS = """
gpus 8
steady * 95 0
square 0 10 0.65 98 0
"""
#: Every GPU family as the text format names it (counters carry ``_total``).
GPU_FAMILIES = {
    "trainmon_gpu_info": "gauge",
    "trainmon_gpu_up": "gauge",
    "trainmon_gpu_utilization_ratio": "gauge",
    "trainmon_gpu_memory_used_bytes": "gauge",
    "trainmon_gpu_memory_total_bytes": "gauge",
    "trainmon_gpu_power_watts": "gauge",
    "trainmon_gpu_power_limit_watts": "gauge",
    "trainmon_gpu_energy_joules_total": "counter",
    "trainmon_gpu_temperature_celsius": "gauge",
    "trainmon_gpu_sm_clock_hertz": "gauge",
    "trainmon_gpu_throttle_seconds_total": "counter",
    "trainmon_gpu_pcie_transmit_bytes_total": "counter",
    "trainmon_gpu_pcie_receive_bytes_total": "counter",
    "trainmon_gpu_nvlink_transmit_bytes_total": "counter",
    "trainmon_gpu_nvlink_receive_bytes_total": "counter",
    "trainmon_gpu_xid_errors_total": "counter",
    "trainmon_gpu_xid_last_timestamp_seconds": "gauge",
    "trainmon_gpu_ecc_errors_total": "counter",
    "trainmon_gpu_util_samples_total": "counter",
    "trainmon_gpu_util_idle_samples_total": "counter",
    "trainmon_gpu_util_transitions_total": "counter",
    "trainmon_gpu_sawtooth_ratio": "gauge",
}
REASONS = ["power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability"]


def test_every_gpu_family_matches_the_scenario(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario(EIGHT_GPUS + "xid 2 0.5 48\nxid 7 0.5 63\n")
    fake_nvml.set_time(0.1)
    collector = start_listening(make_collector())
    fake_nvml.set_time(10.0)
    wait_for(lambda: len(collector.xid.counts()) == 2)
    collector.sampler.poll()
    result = scrape(collector)

    assert {name: result.types.get(name) for name in GPU_FAMILIES} == GPU_FAMILIES
    info = result.samples["trainmon_gpu_info"]
    assert len(info) == 8 and set(info.values()) == {1.0}
    labels = dict(sorted(info)[3])
    assert labels == {
        "gpu": "3",
        "uuid": "GPU-00000003-fake-4000-8000-000000000003",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:1B:00.0",
        "driver_version": "550.54.15",
    }
    assert result.by_gpu("trainmon_gpu_up") == dict.fromkeys(gpus(8), 1.0)
    expected: dict[str, Callable[[int], float]] = {
        "trainmon_gpu_memory_total_bytes": lambda i: 80 * 2**30,
        "trainmon_gpu_memory_used_bytes": lambda i: (i + 1) * 2**30,
        "trainmon_gpu_power_watts": lambda i: 250 + i,
        "trainmon_gpu_power_limit_watts": lambda i: 700,
        "trainmon_gpu_energy_joules_total": lambda i: 1000 * (i + 1) + 10 * (250 + i),
        "trainmon_gpu_temperature_celsius": lambda i: 40 + i,
        "trainmon_gpu_sm_clock_hertz": lambda i: 1980e6,
        "trainmon_gpu_pcie_transmit_bytes_total": lambda i: (i + 1) * 1e9,
        "trainmon_gpu_pcie_receive_bytes_total": lambda i: 2 * (i + 1) * 1e9,
        "trainmon_gpu_nvlink_transmit_bytes_total": lambda i: 18 * 1000 * (i + 1) * 1024,
        "trainmon_gpu_nvlink_receive_bytes_total": lambda i: 18 * 2000 * (i + 1) * 1024,
    }
    for name, formula in expected.items():
        assert result.by_gpu(name) == {str(i): pytest.approx(formula(i)) for i in range(8)}, name
    for policy, reason in enumerate(REASONS):
        assert result.by_gpu("trainmon_gpu_throttle_seconds_total", reason=reason) == {
            str(i): (i + 1) * (policy + 1) for i in range(8)
        }
    assert result.by_gpu("trainmon_gpu_ecc_errors_total", severity="corrected") == {
        str(i): 10 * i for i in range(8)
    }
    assert result.by_gpu("trainmon_gpu_ecc_errors_total", severity="uncorrected") == {
        str(i): i for i in range(8)
    }
    samples = int(10.0 / (1.0 / 6)) + 1  # the fake's buffer at t = 10 s
    assert result.by_gpu("trainmon_gpu_util_samples_total") == dict.fromkeys(gpus(8), samples)
    assert result.by_gpu("trainmon_gpu_utilization_ratio")["5"] == 0.95
    assert result.by_gpu("trainmon_gpu_util_idle_samples_total")["0"] > 0
    assert result.by_gpu("trainmon_gpu_util_transitions_total")["0"] == 2  # at 6.5 s and 10 s
    xids = result.samples["trainmon_gpu_xid_errors_total"]
    assert xids == {(("gpu", "2"), ("xid", "48")): 1.0, (("gpu", "7"), ("xid", "63")): 1.0}
    health = dict(collector.health())
    assert "gpm" in health  # its states: tests/gpu/test_gpm.py
    del health["gpm"]
    assert health == {
        "driver_version": "550.54.15",
        "gpus": 8,
        "lost_gpus": [],
        "generation": 1,
        "xid_events": "listening",
    }


def test_a_lost_gpu_drops_only_its_own_up(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario(EIGHT_GPUS + "lost 3 5\n")
    fake_nvml.set_time(4.0)
    collector = make_collector()
    before = scrape(collector)
    assert before.by_gpu("trainmon_gpu_up") == dict.fromkeys(gpus(8), 1.0)

    fake_nvml.set_time(6.0)
    collector.sampler.poll()
    after = scrape(collector)
    assert after.by_gpu("trainmon_gpu_up") == {**dict.fromkeys(gpus(8), 1.0), "3": 0.0}
    assert "3" in after.by_gpu("trainmon_gpu_info")
    for name in ("trainmon_gpu_power_watts", "trainmon_gpu_energy_joules_total"):
        assert set(after.by_gpu(name)) == set(gpus(8)) - {"3"}, name
    energy_before = before.by_gpu("trainmon_gpu_energy_joules_total")
    energy_after = after.by_gpu("trainmon_gpu_energy_joules_total")
    assert all(energy_after[gpu] > energy_before[gpu] for gpu in energy_after)
    assert collector.health()["lost_gpus"] == [3]


def test_a_gpu_lost_before_start_up_is_reported_down_from_the_first_scrape(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 3\nlost 1 0\n")
    fake_nvml.set_time(1.0)
    collector = make_collector()
    collector.start()
    result = scrape(collector)
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 0.0, "2": 1.0}
    info = {dict(key)["gpu"]: dict(key)["uuid"] for key in result.samples["trainmon_gpu_info"]}
    assert info["1"] == "" and info["2"] == "GPU-00000002-fake-4000-8000-000000000002"
    assert set(result.by_gpu("trainmon_gpu_util_samples_total")) == {"0", "2"}


def test_an_xid_scheduled_twice_is_counted_twice(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 4\nxid 1 2 79\nxid 1 3 79\nxid 2 3 13\nxid 0 0.1 31\n")
    fake_nvml.set_time(1.0)  # registration happens now: the XID at 0.1 s is before it
    collector = start_listening(make_collector())
    fake_nvml.set_time(4.0)
    received = time.time()
    wait_for(lambda: sum(count.count for count in collector.xid.counts().values()) == 3)
    result = scrape(collector)
    assert result.samples["trainmon_gpu_xid_errors_total"] == {
        (("gpu", "1"), ("xid", "79")): 2.0,
        (("gpu", "2"), ("xid", "13")): 1.0,
    }
    stamps = result.samples["trainmon_gpu_xid_last_timestamp_seconds"].values()
    assert all(received - 1 <= stamp <= time.time() for stamp in stamps)


def test_a_gpu_whose_xid_registration_failed_is_not_listened_to(
    scenario: Callable[[str], Path],
    make_collector: Callable[..., GPUCollector],
) -> None:
    scenario("gpus 2\nfailing * nvmlDeviceRegisterEvents\n")
    collector = make_collector()
    collector.start()
    wait_for(lambda: collector.xid.state != "starting")
    assert collector.health()["xid_events"] == "unsupported"


def test_an_unsupported_reading_is_omitted_and_logged_once(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    caplog: pytest.LogCaptureFixture,
) -> None:
    scenario(
        "gpus 3\nunsupported 2 nvmlDeviceGetTotalEccErrors\n"
        "unsupported * nvmlDeviceGetTemperature\nunsupported_field 1 198\n"
    )
    collector = make_collector()
    caplog.set_level(logging.INFO, logger="trainmon.gpu.nvml")
    for _ in range(3):
        result = scrape(collector)
    assert set(result.by_gpu("trainmon_gpu_ecc_errors_total", severity="corrected")) == {"0", "1"}
    assert "trainmon_gpu_temperature_celsius" not in result.samples
    assert set(result.by_gpu("trainmon_gpu_pcie_receive_bytes_total")) == {"0", "2"}
    assert set(result.by_gpu("trainmon_gpu_pcie_transmit_bytes_total")) == {"0", "1", "2"}
    assert result.by_gpu("trainmon_gpu_up") == dict.fromkeys(gpus(3), 1.0)  # not an error
    assert "NaN" not in result.text
    ecc_lines = [r for r in caplog.records if "nvmlDeviceGetTotalEccErrors" in r.getMessage()]
    assert len(ecc_lines) == 1 and "NOT_SUPPORTED" in ecc_lines[0].getMessage()


def test_nvlink_counters_are_summed_per_link_when_the_driver_rejects_the_all_links_scope(
    scenario: Callable[[str], Path],
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 2\nno_nvlink_aggregate 1\n")
    result = scrape(make_collector())
    assert result.by_gpu("trainmon_gpu_nvlink_transmit_bytes_total") == {
        "0": 18 * 1000 * 1024,
        "1": 18 * 2000 * 1024,
    }
    assert result.by_gpu("trainmon_gpu_nvlink_receive_bytes_total")["1"] == 18 * 4000 * 1024


def test_gpus_without_nvlink_have_no_nvlink_series(
    scenario: Callable[[str], Path],
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 2\nunsupported_field * 138\nunsupported_field * 139\nunsupported_field 0 91\n")
    result = scrape(make_collector())
    assert "trainmon_gpu_nvlink_transmit_bytes_total" not in result.samples
    assert "trainmon_gpu_nvlink_receive_bytes_total" not in result.samples
    assert set(result.by_gpu("trainmon_gpu_pcie_transmit_bytes_total")) == {"0", "1"}


def test_the_sampler_sees_a_sawtooth_through_nvml(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario(
        "gpus 4\nsteady * 95 4\nsquare 0 10 0.65 98 1\nsaw 1 30 0.5 100 0\n"
        "square 2 20 0.3 97 0\nsparse_idle 2\n"
    )
    collector = make_collector(window_seconds=30.0)
    for second in range(1, 91):
        fake_nvml.set_time(float(second))
        collector.sampler.poll()
    result = scrape(collector)
    ratio = result.by_gpu("trainmon_gpu_sawtooth_ratio")
    assert ratio["0"] == ratio["1"] == ratio["2"] == 1.0 and ratio["3"] == 0.0
    assert ratio["0"] >= FLAG_THRESHOLD
    transitions = result.by_gpu("trainmon_gpu_util_transitions_total")
    assert transitions["0"] == 18 and transitions["3"] == 0  # down at 6.5 … 86.5, up at 10 … 90
    samples = result.by_gpu("trainmon_gpu_util_samples_total")
    assert samples["3"] == int(90 / (1 / 6)) + 1  # every driver sample, none twice
    assert samples["2"] < samples["3"]  # the driver kept fewer idle samples
    idle = result.by_gpu("trainmon_gpu_util_idle_samples_total")
    assert idle["0"] == pytest.approx(0.35 * samples["0"], rel=0.05)


def test_without_driver_samples_the_sampler_falls_back_to_utilization_rates(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 1\nno_samples 0\nsquare 0 4 0.5 90 0\n")
    collector = make_collector(window_seconds=10.0)
    for step in range(1, 41):
        fake_nvml.set_time(step * 0.5)
        collector.sampler.poll()
    result = scrape(collector)
    assert result.by_gpu("trainmon_gpu_util_samples_total") == {"0": 40}
    assert result.by_gpu("trainmon_gpu_util_transitions_total")["0"] >= 8
    assert result.by_gpu("trainmon_gpu_sawtooth_ratio") == {"0": 1.0}


def test_without_a_driver_the_collector_is_unavailable_with_a_hint(
    fake_nvml: FakeNVML,
    monkeypatch: pytest.MonkeyPatch,
    make_collector: Callable[..., GPUCollector],
) -> None:
    monkeypatch.delenv("FAKENVML_SCENARIO", raising=False)
    collector = make_collector()
    collector.start()  # never raises: the threads wait for NVML
    with pytest.raises(NVMLUnavailable, match=r"kernel driver is not loaded.*DRIVER_NOT_LOADED"):
        list(collector.collect())
    assert collector.processes() == {}


def test_a_driver_reload_is_survived(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    clock: Clock,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 2\ndriver_unloaded 5 8\n")
    fake_nvml.set_time(4.0)
    collector = make_collector()
    assert scrape(collector).by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}

    fake_nvml.set_time(6.0)  # the module is being reloaded
    with pytest.raises(NVMLUnavailable, match="DRIVER_NOT_LOADED"):
        list(collector.collect())
    with pytest.raises(NVMLUnavailable, match="kernel driver is not loaded"):
        list(collector.collect())  # re-init failed; retried only after retry_seconds

    fake_nvml.set_time(9.0)  # loaded again: the old session is stale
    with pytest.raises(NVMLUnavailable):
        list(collector.collect())  # still inside the retry interval
    clock.now += 5.0
    result = scrape(collector)
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}
    assert collector.health()["generation"] == 2


def test_a_stale_session_after_a_reload_is_reopened(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 1\ndriver_unloaded 5 8\n")
    fake_nvml.set_time(1.0)
    collector = make_collector()
    scrape(collector)
    fake_nvml.set_time(9.0)  # the reload happened between two scrapes
    with pytest.raises(NVMLUnavailable, match="UNINITIALIZED"):
        list(collector.collect())
    assert scrape(collector).by_gpu("trainmon_gpu_up") == {"0": 1.0}


def test_process_lists_are_read_at_most_every_process_interval(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    clock: Clock,
    make_collector: Callable[..., GPUCollector],
) -> None:
    first = scenario("gpus 2\nprocess 0 1234 1073741824\nprocess 0 99 5\nprocess 1 7 0\n")
    collector = make_collector(process_interval_seconds=15.0)
    assert collector.processes() == {
        0: (GPUProcess(1234, 2**30), GPUProcess(99, 5)),
        1: (GPUProcess(7, 0),),
    }
    calls = fake_nvml.calls()
    clock.now += 10
    assert collector.processes()[1] == (GPUProcess(7, 0),)
    assert fake_nvml.calls() == calls  # served from the last read
    first.write_text("unused")  # (the fake only rereads a scenario whose path changed)
    clock.now += 6
    collector.processes()
    assert fake_nvml.calls() > calls
