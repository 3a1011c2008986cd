"""``idle_allocated`` for GPUs the kubelet allocated to a pod that runs nothing on them.

The attribution collector reads the allocations from a fake kubelet's pod-resources
API (``testkit.fake_kubelet``, a real gRPC server); the ledger's holdings
(``trainmon.collectors.ledger.ProcessHoldings``) add them to NVML's processes, and the
recorder books the idle ones to the pod's pseudo-job ``pod:<namespace>/<pod>``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.core import GaugeMetricFamily

from testkit.exposition import Scrape, scrape
from testkit.fake_kubelet import FakeKubelet, fake_kubelet
from tests.diagnosis.diagnosis_support import ProcTree, SysTree
from tests.ledger.ledger_support import Clocks, make_recorder
from trainmon.attribution import ProcessAttributor
from trainmon.attribution.podresources import (
    PodResourcesClient,
    PodResourcesPoller,
)
from trainmon.attribution.podresources_wire import (
    ContainerDevices,
    ContainerResources,
    PodResources,
)
from trainmon.collectors.attribution import AttributionCollector, AttributionConfig
from trainmon.collectors.ledger import ProcessHoldings

GPU = [f"GPU-{i:08x}-fake-4000-8000-{i:012x}" for i in range(3)]
TICK = 10.0
TICKS = 4


def pod(name: str, namespace: str, gpu: str) -> PodResources:
    return PodResources(name, namespace, (ContainerResources(
        "main", (ContainerDevices("nvidia.com/gpu", (gpu,)),)),))


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    folder = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))  # socket paths are short
    try:
        with fake_kubelet(folder) as server:
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def booked(kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree, clocks: Clocks,
           tmp_path: Path, processes: dict[int, list[SimpleNamespace]]) -> Scrape:
    """``TICKS`` recorder ticks with the kubelet's allocations and ``processes``."""
    poller = PodResourcesPoller(PodResourcesClient(kubelet.socket))
    attribution = AttributionCollector(AttributionConfig(nccl_checks=False), proc.root,
                                       sys_tree.root, lambda: processes, pod_resources=poller)
    poller.poll()
    info = GaugeMetricFamily("trainmon_gpu_info", "GPUs", labels=["gpu", "uuid"])
    for index, uuid in enumerate(GPU):
        info.add_metric([str(index), uuid], 1.0)
    attribution.observe([info])
    holdings = ProcessHoldings(lambda: processes, ProcessAttributor(proc.root), proc.root,
                               attribution.allocations)
    training, ledger = make_recorder(clocks, tmp_path / "ledger.sqlite3",
                                     flush_seconds=3600.0, holdings=holdings)()
    ledger.start()
    try:
        ledger.tick()
        for _ in range(1, TICKS):
            clocks.advance(TICK)
            ledger.tick()
        return scrape(ledger)
    finally:
        ledger.stop()
        training.stop()
        poller.stop()


def test_a_notebook_pod_with_an_allocated_gpu_and_no_process_is_idle_allocated(
    kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree, clocks: Clocks, tmp_path: Path
) -> None:
    kubelet.pods = [pod("notebook-0", "team-a", GPU[0]), pod("trainer-0", "team-b", "1")]
    proc.add(4242, environ={"TRAINMON_JOB": "resnet50"})  # the trainer's process, GPU 1
    exposition = booked(kubelet, proc, sys_tree, clocks, tmp_path,
                        {1: [SimpleNamespace(pid=4242)]})
    seconds = exposition.series("trainmon_job_gpu_seconds_total", "job", "owner", "bucket")
    pods = {key: value for key, value in seconds.items() if key[0].startswith("pod:") and value}
    # GPU 1 is the process's (booked to the job it names), not its pod's
    assert pods == {("pod:team-a/notebook-0", "pod:team-a/notebook-0", "idle_allocated"):
                    pytest.approx((TICKS - 1) * TICK)}
    assert seconds[("resnet50", f"uid:{os.getuid()}", "idle_allocated")] \
        == pytest.approx((TICKS - 1) * TICK)
    assert exposition.value("trainmon_job_team_info", job="pod:team-a/notebook-0",
                            team="team-a") == 1.0


def test_an_allocated_gpu_a_process_holds_is_not_the_pods_idle_time(
    kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree, clocks: Clocks, tmp_path: Path
) -> None:
    kubelet.pods = [pod("notebook-0", "team-a", GPU[2])]
    proc.add(5000, environ={"TRAINMON_JOB": "notebook"})
    exposition = booked(kubelet, proc, sys_tree, clocks, tmp_path,
                        {2: [SimpleNamespace(pid=5000)]})
    jobs = {job for job, _, _ in exposition.series(
        "trainmon_job_gpu_seconds_total", "job", "owner", "bucket")}
    assert jobs == {"notebook"}  # the process's own job, not the pod's pseudo-job
