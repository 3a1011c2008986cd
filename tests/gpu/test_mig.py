"""MIG GPU instances through the real pynvml and the fake libnvidia-ml.so.1.

The fake's MIG directives (``mig``, ``mig_instance``, ``mig_gpm``,
``mig_process``, see ``testkit/fakenvml/README.md``) give a GPU in MIG mode its
GPU instances with their memory, GPM activity and processes. The GPM sampler
is driven by hand (``collector.gpm.poll()`` on the fake's frozen clock), as in
``test_gpm.py``; every test checks that no sample buffer leaks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import Scrape
from tests.diagnosis.diagnosis_support import ContractSource
from tests.gpu.gpu_support import Clock, FakeNVML, poll_at
from trainmon.collectors.gpu import GPUCollector
from trainmon.diagnosis.measure import MEASURED_SAMPLES, measure
from trainmon.diagnosis.rules import diagnose
from trainmon.diagnosis.samples import ScrapedSamples, Window
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.gpu.nvml import mig_profile
from trainmon.gpu.types import GPUProcess

MIB = 2**20
#: GPU 0 in MIG mode with three instances (GPM on two), GPU 1 a whole GPU.
MIG_NODE = """\
gpus 2
gpm * 50 40 30 20
mig 0
mig_instance 0 1 3g.40gb 2048 40960
mig_instance 0 2 1g.10gb 512 10240
mig_instance 0 9 1g.10gb 0 10240
mig_gpm 0 1 80 60 70 40
mig_gpm 0 2 10 5 0 15
mig_process 0 1 4242 1073741824
mig_process 0 2 4343 536870912
process 1 77 1048576
"""
MIG_FAMILIES = (
    "trainmon_gpu_mig_info",
    "trainmon_gpu_mig_process_info",
    "trainmon_gpu_mig_memory_used_bytes",
    "trainmon_gpu_mig_memory_total_bytes",
    "trainmon_gpu_mig_sm_active_ratio",
    "trainmon_gpu_mig_tensor_active_ratio",
    "trainmon_gpu_mig_dram_active_ratio",
)
LABELS = ("gpu", "gpu_instance_id", "mig_profile")


def test_gpu_instances_are_exported_with_memory_activity_and_processes(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    scenario(MIG_NODE)
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0, 2.0)
    assert live() == 2 * (2 + 3)  # two buffers for each GPU and each instance
    result = scrape(collector)

    assert result.series("trainmon_gpu_mig_info", *LABELS, "uuid") == {
        ("0", "1", "3g.40gb", "MIG-00000000-fake-4000-8000-000000000001"): 1.0,
        ("0", "2", "1g.10gb", "MIG-00000000-fake-4000-8000-000000000002"): 1.0,
        ("0", "9", "1g.10gb", "MIG-00000000-fake-4000-8000-000000000009"): 1.0,
    }
    assert result.series("trainmon_gpu_mig_memory_used_bytes", *LABELS) == {
        ("0", "1", "3g.40gb"): 2048 * MIB,
        ("0", "2", "1g.10gb"): 512 * MIB,
        ("0", "9", "1g.10gb"): 0.0,
    }
    assert result.series("trainmon_gpu_mig_memory_total_bytes", *LABELS)[
        ("0", "1", "3g.40gb")
    ] == 40960 * MIB
    assert result.series("trainmon_gpu_mig_sm_active_ratio", *LABELS) == {
        ("0", "1", "3g.40gb"): 0.8,
        ("0", "2", "1g.10gb"): 0.1,
        ("0", "9", "1g.10gb"): 0.0,  # an instance without mig_gpm reads 0 %
    }
    assert result.series("trainmon_gpu_mig_tensor_active_ratio", *LABELS)[
        ("0", "1", "3g.40gb")
    ] == 0.7
    assert result.series("trainmon_gpu_mig_dram_active_ratio", *LABELS)[
        ("0", "2", "1g.10gb")
    ] == 0.15
    # The whole GPU's own series stay as they are, for both GPUs.
    assert result.by_gpu("trainmon_gpu_sm_active_ratio") == {"0": 0.5, "1": 0.5}
    assert result.by_gpu("trainmon_gpu_memory_used_bytes") == {"0": 2**30, "1": 2 * 2**30}
    # Processes with their instance, from the process list attribution reads too.
    assert result.series("trainmon_gpu_mig_process_info", "gpu", "gpu_instance_id", "pid") == {
        ("0", "1", "4242"): 1.0,
        ("0", "2", "4343"): 1.0,
    }
    assert collector.processes() == {
        0: (GPUProcess(4242, 2**30, 1), GPUProcess(4343, 512 * MIB, 2)),
        1: (GPUProcess(77, MIB, None),),
    }
    collector.stop()
    assert live() == 0


def test_a_node_without_mig_exposes_no_mig_family(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    # Instances listed for a GPU not in MIG mode do not exist (MIG is off).
    scenario("gpus 2\ngpm * 50 40 30 20\nmig_instance 0 1 3g.40gb 2048 40960\nprocess 0 7 0\n")
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0, 2.0)
    assert live() == 4  # the GPUs' buffers only
    first = scrape(collector)
    assert not [name for name in first.types if name.startswith("trainmon_gpu_mig_")]
    assert "mig" not in first.text.replace("trainmon_gpu_", "")
    assert collector.processes() == {0: (GPUProcess(7, 0, None),), 1: ()}
    collector.stop()
    assert live() == 0


def test_mig_not_supported_is_omitted_not_failed(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    """An old driver or GPU answering NOT_SUPPORTED to the MIG calls: no MIG series,
    the GPU stays up; per-instance GPM unsupported leaves memory and the GPU's GPM."""
    scenario(MIG_NODE + "unsupported 0 nvmlDeviceGetMigMode\n")
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0, 2.0)
    result = scrape(collector)
    assert not [name for name in result.types if name.startswith("trainmon_gpu_mig_")]
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}
    assert live() == 4
    collector.stop()

    scenario(MIG_NODE + "unsupported 0 nvmlGpmMigSampleGet\n")
    collector = make_collector()
    poll_at(fake_nvml, collector, 3.0, 4.0, 5.0)
    result = scrape(collector)
    assert len(result.samples["trainmon_gpu_mig_memory_used_bytes"]) == 3
    assert "trainmon_gpu_mig_sm_active_ratio" not in result.samples
    assert result.by_gpu("trainmon_gpu_sm_active_ratio") == {"0": 0.5, "1": 0.5}
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}
    assert live() == 4  # the instances' buffers were freed
    collector.stop()
    assert live() == 0


def test_a_failing_mig_call_marks_the_gpu_and_keeps_the_rest(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
) -> None:
    scenario(MIG_NODE + "failing 0 nvmlDeviceGetMemoryInfo\n")
    result = scrape(make_collector())
    # The instances are still listed; their memory (as the GPU's) is omitted.
    assert len(result.samples["trainmon_gpu_mig_info"]) == 3
    assert "trainmon_gpu_mig_memory_used_bytes" not in result.samples
    assert result.by_gpu("trainmon_gpu_memory_used_bytes") == {"1": 2 * 2**30}


def test_a_destroyed_instance_is_dropped_at_the_next_layout_read(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    clock: Clock,
    make_collector: Callable[..., GPUCollector],
    scrape: Callable[..., Scrape],
    live: Callable[[], int],
) -> None:
    """Instances come and go without a GPU reset: the layout is read again every
    ``mig_refresh_seconds`` (60 s here), and the sampler frees a gone instance's buffers."""
    scenario(MIG_NODE + "mig_destroyed 0 9 10\n")
    collector = make_collector()
    poll_at(fake_nvml, collector, 1.0, 2.0)
    assert live() == 10
    poll_at(fake_nvml, collector, 11.0)  # gone, the layout not read again yet
    assert len(scrape(collector).samples["trainmon_gpu_mig_info"]) == 3
    clock.now += 61.0
    poll_at(fake_nvml, collector, 12.0, 13.0)
    assert live() == 8
    result = scrape(collector)
    assert sorted(key[1] for key in result.series("trainmon_gpu_mig_info", *LABELS, "uuid")) == [
        "1", "2"]
    assert sorted(key[1] for key in result.series("trainmon_gpu_mig_sm_active_ratio", *LABELS)) == [
        "1", "2"]
    assert result.by_gpu("trainmon_gpu_up") == {"0": 1.0, "1": 1.0}
    collector.stop()
    assert live() == 0


def test_the_diagnosis_reads_a_rank_on_an_instance_as_the_gpu_it_is(
    scenario: Callable[[str], Path],
    fake_nvml: FakeNVML,
    make_collector: Callable[..., GPUCollector],
    live: Callable[[], int],
) -> None:
    """Rank 0 of job ``a`` is process 4242, on GPU 0's instance 1 (3g.40gb): its
    evidence is that instance's memory and GPM activity, not GPU 0's."""
    scenario(MIG_NODE)
    collector = make_collector()
    training = ContractSource(name="training")  # what the training collector would export
    training.set("trainmon_training_rank_info", 1.0, job="a", rank="0", gpu="0", pid="4242")
    snapshots = []
    for second, steps in ((1.0, 10.0), (2.0, 40.0), (3.0, 70.0)):
        poll_at(fake_nvml, collector, second)
        training.set("trainmon_training_step_seconds_count", steps, job="a", rank="0")
        training.set("trainmon_training_step_seconds_sum", steps * 0.1, job="a", rank="0")
        families = [*collector.collect(), *training.collect()]
        snapshots.append(ScrapedSamples.from_families(
            families, 30.0 * second, 1_000_000.0 + 30.0 * second, MEASURED_SAMPLES))
    node = measure(Window(snapshots))

    assert [(rank.job, rank.gpu) for rank in node.ranks] == [("a", "0/mig1")]
    gpus = {gpu.gpu: gpu for gpu in node.gpus}
    assert sorted(gpus) == ["0", "0/mig1", "0/mig2", "0/mig9", "1"]
    instance = gpus["0/mig1"]
    assert (instance.memory_used_bytes, instance.memory_total_bytes) == (2048 * MIB, 40960 * MIB)
    assert (instance.sm_active, instance.tensor_active, instance.dram_active) == (0.8, 0.7, 0.4)
    assert instance.model == gpus["0"].model == "NVIDIA H100 80GB HBM3"
    assert gpus["0"].sm_active == 0.5  # the whole GPU keeps its own reading

    [verdict] = diagnose(node, DiagnosisConfig())
    assert verdict.evidence.gpus == ("0/mig1",)
    assert verdict.evidence.gpm_gpus == ("0/mig1",)
    assert verdict.evidence.sm_active_ratio == 0.8
    assert verdict.evidence.memory_used_ratio == 2048 / 40960
    collector.stop()
    assert live() == 0


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", "1c.3g.40gb"),
        ("NVIDIA H100 80GB HBM3", ""),
        ("", ""),
    ],
)
def test_the_profile_is_read_from_the_mig_device_name(name: str, profile: str) -> None:
    assert mig_profile(name) == profile
