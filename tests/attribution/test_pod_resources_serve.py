"""``trainmon serve`` on the fake NVML with a fake kubelet's pod-resources API.

The daemon polls ``testkit.fake_kubelet`` (a real gRPC server on a unix socket)
and maps its device-plugin allocations to the fake NVML's GPUs (by UUID, by
index, a MIG instance by its UUID to its parent GPU); then the
kubelet goes away, and the scrapes go on while ``/healthz`` says why.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import Scrape, parse
from testkit.fake_kubelet import FakeKubelet, fake_kubelet
from trainmon.attribution.podresources_wire import (
    ContainerDevices,
    ContainerResources,
    PodResources,
)

pytestmark = pytest.mark.integration

#: The fake NVML's UUIDs (``nvmlDeviceGetUUID`` in testkit/fakenvml/fakenvml.c).
GPU = [f"GPU-{i:08x}-fake-4000-8000-{i:012x}" for i in range(3)]
#: GPU 2's MIG instance 1 (the fake's UUID: GPU index << 16 | instance id).
MIG = "MIG-00000002-fake-4000-8000-000000020001"
PODS = [
    # a notebook that reserved GPU 0 (by UUID) and runs nothing on it
    PodResources("notebook-0", "team-a", (ContainerResources(
        "jupyter", (ContainerDevices("nvidia.com/gpu", (GPU[0],)),)),)),
    # a trainer given GPU 1 by index, whose process runs there
    PodResources("trainer-0", "team-b", (ContainerResources(
        "pytorch", (ContainerDevices("nvidia.com/gpu", ("1",)),)),)),
    # a server given a MIG instance of GPU 2
    PodResources("infer-0", "team-c", (ContainerResources(
        "server", (ContainerDevices("nvidia.com/mig-1g.10gb", (MIG,)),)),)),
]


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    folder = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))  # socket paths are short
    try:
        with fake_kubelet(folder) as server:
            server.pods = list(PODS)
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def scrape_until(daemon: Daemon, condition: Callable[[Scrape], bool],
                 timeout: float = 20.0) -> Scrape:
    deadline = time.monotonic() + timeout
    while True:
        result = parse(daemon.metrics())
        if condition(result):
            return result
        assert time.monotonic() < deadline, f"not reached in {timeout}s:\n{daemon.log()}"
        time.sleep(0.1)


def allocations(result: Scrape) -> list[tuple[str, str, str, str, str]]:
    return sorted((row["gpu"], row["uuid"], row["namespace"], row["pod"], row["container"])
                  for row in result.labelsets("trainmon_gpu_allocation_info"))


def test_serve_exports_allocations_of_the_fake_nvml_gpus(
    start_daemon: Callable[..., Daemon], fake_nvml_dir: Path, kubelet: FakeKubelet,
    tmp_path: Path
) -> None:
    scenario = tmp_path / "scenario.txt"
    scenario.write_text("gpus 3\nsteady * 0 0\nprocess 1 4242 1000000\n"
                        "mig 2\nmig_instance 2 1 1g.10gb 100 10240\n")
    daemon = start_daemon(
        config={"collectors": {
            "gpu": {"retry_seconds": 1},
            "attribution": {"pod_resources_socket": str(kubelet.socket),
                            "pod_resources_interval_seconds": 0.1,
                            "pod_resources_timeout_seconds": 0.5}}},
        env={"LD_LIBRARY_PATH": str(fake_nvml_dir), "FAKENVML_SCENARIO": str(scenario)},
    )
    result = scrape_until(daemon, lambda r: len(r.labelsets("trainmon_gpu_allocation_info")) == 3
                          and all(row["gpu"] for row in
                                  r.labelsets("trainmon_gpu_allocation_info")))
    assert allocations(result) == [
        ("0", GPU[0], "team-a", "notebook-0", "jupyter"),
        ("1", GPU[1], "team-b", "trainer-0", "pytorch"),
        ("2", MIG, "team-c", "infer-0", "server"),  # by the GPU collector's MIG info
    ]
    assert result.value("trainmon_pod_resources_requests_total", call="list", result="ok")

    kubelet.stop()  # the kubelet goes away: scrapes go on, /healthz says why
    result = scrape_until(daemon, lambda r: not r.labelsets("trainmon_gpu_allocation_info"))
    assert result.value("trainmon_collector_success", collector="attribution") == 1
    assert len(result.labelsets("trainmon_gpu_info")) == 3
    assert (result.value("trainmon_pod_resources_requests_total", call="list",
                         result="unavailable") or 0) >= 1
    status, body = daemon.get("/healthz")
    assert status == 200
    entry = json.loads(body)["collectors"]["attribution"]
    assert entry["state"] == "degraded"
    assert "UNAVAILABLE" in entry["pod_resources_error"]
