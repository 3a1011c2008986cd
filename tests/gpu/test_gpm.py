"""GPM activity (``trainmon.gpu.gpm``) through the real pynvml and the fake libnvidia-ml.so.1.

The fake's GPM metrics are the scenario's percentages (``gpm GPU SM OCC TENSOR
DRAM``; pipes derived from them, see ``fakenvml/README.md``), and it counts
sample buffers allocated and freed, so every test can check that none leaks.
The sampler is driven by hand (``collector.gpm.poll()``, the test thread being
the buffers' one owner) except where the thread itself is under test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import Scrape
from tests.gpu.gpu_support import Clock, FakeNVML, poll_at, wait_for
from trainmon.collectors.gpu import GPUCollector
from trainmon.gpu.types import NVMLUnavailable

GPM_FAMILIES = (
    "trainmon_gpu_sm_active_ratio",
    "trainmon_gpu_sm_occupancy_ratio",
    "trainmon_gpu_tensor_active_ratio",
    "trainmon_gpu_pipe_active_ratio",
    "trainmon_gpu_dram_active_ratio",
)
PIPES = ("fp16", "fp32", "fp64", "tensor_hmma", "tensor_imma", "tensor_dfma")


def test_activity_is_exported_as_ratios_from_consecutive_samples(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    scenario("gpus 3\ngpm * 80 50 60 40\ngpm 2 10 20 5 30\ngpm_metric_unsupported 1 9\n")
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0)
    first = scrape(collector)
    assert not any(name in first.samples for name in GPM_FAMILIES)  # one sample measures nothing
    assert live() == 6  # two buffers per GPU

    poll_at(fake_nvml, collector, 2.0, 3.0)
    result = scrape(collector)
    assert result.by_gpu("trainmon_gpu_sm_active_ratio") == {"0": 0.8, "1": 0.8, "2": 0.1}
    assert result.by_gpu("trainmon_gpu_sm_occupancy_ratio") == {"0": 0.5, "1": 0.5, "2": 0.2}
    assert result.by_gpu("trainmon_gpu_tensor_active_ratio") == {"0": 0.6, "1": 0.6, "2": 0.05}
    assert result.by_gpu("trainmon_gpu_dram_active_ratio") == {"0": 0.4, "1": 0.4, "2": 0.3}
    pipes = result.series("trainmon_gpu_pipe_active_ratio", "gpu", "pipe")
    assert {pipe: pipes[("0", pipe)] for pipe in PIPES} == {
        "fp16": 0.2,
        "fp32": 0.4,
        "fp64": 0.0,
        "tensor_hmma": 0.6,
        "tensor_imma": 0.0,
        "tensor_dfma": 0.0,
    }
    assert {pipe for gpu, pipe in pipes if gpu == "1"} == set(PIPES) - {"tensor_imma"}
    assert result.types["trainmon_gpu_sm_active_ratio"] == "gauge"
    assert collector.health()["gpm"] == {"0": "sampling", "1": "sampling", "2": "sampling"}
    assert live() == 6  # the two buffers alternate; none is added per sample

    collector.stop()
    assert live() == 0


def test_gpus_without_gpm_have_no_series_and_health_says_why(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    scenario(
        "gpus 3\ngpm * 70 40 30 20\ngpm_unsupported 1\nunsupported 2 nvmlGpmQueryDeviceSupport\n"
    )
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0, 2.0, 3.0)
    result = scrape(collector)
    for name in GPM_FAMILIES:
        assert {labels["gpu"] for labels in result.labelsets(name)} == {"0"}, name
    gpm = collector.health()["gpm"]
    assert gpm == {
        "0": "sampling",
        "1": "unsupported: nvmlGpmQueryDeviceSupport: this GPU does not support GPM",
        "2": "unsupported: nvmlGpmQueryDeviceSupport: NVML_ERROR_NOT_SUPPORTED",
    }
    assert live() == 2  # only GPU 0 holds buffers
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0, "2": 1.0}
    assert "NaN" not in result.text


def test_a_struct_version_the_driver_rejects_disables_gpm_with_the_reason(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    scenario("gpus 2\ngpm * 70 40 30 20\ngpm_version 2\n")
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0, 2.0, 3.0)
    result = scrape(collector)
    assert not any(name in result.samples for name in GPM_FAMILIES)
    assert collector.health()["gpm"] == dict.fromkeys(
        ("0", "1"),
        "unsupported: nvmlGpmQueryDeviceSupport: NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    )
    assert live() == 0
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}


def test_a_gpu_lost_while_sampling_frees_its_buffers_and_is_probed_again(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    clock: Clock,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    scenario("gpus 2\ngpm * 80 50 60 40\nlost 1 5 9\n")
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0, 2.0)
    assert set(scrape(collector).by_gpu("trainmon_gpu_sm_active_ratio")) == {"0", "1"}
    assert live() == 4

    poll_at(fake_nvml, collector, 6.0)  # GPU 1 fell off the bus
    assert live() == 2
    result = scrape(collector)
    assert result.by_gpu("trainmon_gpu_sm_active_ratio") == {"0": 0.8}
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 0.0}
    assert "lost" in str(collector.health()["gpm"]["1"])  # type: ignore[index]

    poll_at(fake_nvml, collector, 10.0)  # back, but not probed before retry_seconds
    assert live() == 2
    clock.now += 6.0
    poll_at(fake_nvml, collector, 11.0, 12.0)
    assert live() == 4
    assert scrape(collector).by_gpu("trainmon_gpu_sm_active_ratio") == {"0": 0.8, "1": 0.8}
    collector.stop()
    assert live() == 0


def test_a_driver_reload_frees_every_buffer_and_sampling_resumes_after(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    clock: Clock,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    scenario("gpus 2\ngpm * 80 50 60 40\ndriver_unloaded 5 8\n")
    collector = make_collector()
    assert collector.gpm is not None
    poll_at(fake_nvml, collector, 1.0, 2.0)
    assert live() == 4

    fake_nvml.set_time(6.0)
    with pytest.raises(NVMLUnavailable):
        collector.gpm.poll()
    assert live() == 0
    assert collector.gpm.snapshot() == {}
    assert "waiting for NVML" in str(collector.health()["gpm"])

    fake_nvml.set_time(9.0)
    clock.now += 6.0
    poll_at(fake_nvml, collector, 9.0, 10.0)
    assert live() == 4
    result = scrape(collector)
    assert result.by_gpu("trainmon_gpu_tensor_active_ratio") == {"0": 0.6, "1": 0.6}
    assert collector.health()["generation"] == 2


def test_the_thread_samples_at_the_configured_interval_and_frees_on_stop(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    scenario("gpus 2\ngpm * 80 50 60 40\n")
    fake_nvml.set_time(-1.0)  # the real clock: samples need distinct timestamps
    collector = make_collector(gpm_interval_seconds=0.2)
    _, _, samples_before = fake_nvml.gpm_counts()
    started = time.monotonic()
    collector.start()
    wait_for(lambda: len(scrape(collector).by_gpu("trainmon_gpu_sm_active_ratio")) == 2)
    time.sleep(1.0)
    collector.stop()
    elapsed = time.monotonic() - started
    _, _, samples_after = fake_nvml.gpm_counts()
    per_gpu = (samples_after - samples_before) / 2
    assert 2 <= per_gpu <= elapsed / 0.2 + 1, (per_gpu, elapsed)
    assert live() == 0  # freed by the thread on its way out


@pytest.mark.parametrize("settings", [{"gpm": False}, {"gpm_interval_seconds": 0.0}])
def test_gpm_can_be_turned_off(
    settings: dict[str, object],
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario("gpus 2\ngpm * 80 50 60 40\n")
    fake_nvml.set_time(-1.0)
    before = fake_nvml.gpm_counts()
    collector = make_collector(**settings)
    collector.start()
    time.sleep(0.3)
    result = scrape(collector)
    assert collector.gpm is None
    assert not any(name in result.samples for name in GPM_FAMILIES)
    assert collector.health()["gpm"] == {"state": "disabled by configuration"}
    assert fake_nvml.gpm_counts() == before  # not one GPM call


def test_a_failing_sample_drops_that_gpus_values_but_keeps_its_buffers(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    scenario("gpus 2\ngpm * 80 50 60 40\nfailing 1 nvmlGpmSampleGet\n")
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0, 2.0)
    assert scrape(collector).by_gpu("trainmon_gpu_sm_active_ratio") == {"0": 0.8}
    health = collector.health()["gpm"]
    assert health == {"0": "sampling", "1": "nvmlGpmSampleGet failed (see the log)"}
    assert live() == 4  # a failure is not "unsupported": GPU 1 keeps its buffers
