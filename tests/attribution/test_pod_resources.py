"""GPU allocations from the kubelet's pod-resources API, against a real gRPC server.

``testkit.fake_kubelet`` serves ``v1.PodResourcesLister`` over a unix socket;
the attribution collector's poller reads it from its own thread. The GPUs are
what the GPU collector exports (``trainmon_gpu_info``, shown to the collector
through ``observe`` as the registry does), or, end to end, the fake NVML under
a real ``trainmon serve``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.core import GaugeMetricFamily

from testkit.exposition import Scrape, scrape
from testkit.fake_kubelet import FakeKubelet, fake_kubelet
from testkit.loopback import LoopbackHTTPServer, Reply, Request
from tests.diagnosis.diagnosis_support import ProcTree, SysTree
from trainmon.attribution import KubeletPodDirectory
from trainmon.attribution.podresources import (
    LIST_METHOD,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesPoller,
)
from trainmon.attribution.podresources_wire import (
    AllocatableResources,
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    PodResources,
    PodResourcesLimits,
)
from trainmon.collectors.attribution import AttributionCollector, AttributionConfig
from trainmon.config import parse_config
from trainmon.section import ConfigError

GPU = [f"GPU-{i:08x}-fake-4000-8000-{i:012x}" for i in range(4)]
MIG = "MIG-00000003-fake-4000-8000-000000030001"


def notebook(gpu: str = GPU[0]) -> PodResources:
    """A notebook pod that reserved a GPU and runs nothing on it."""
    return PodResources("notebook-0", "team-a", (ContainerResources(
        "jupyter", (ContainerDevices("nvidia.com/gpu", (gpu,)),)),))


PODS = [
    notebook(),
    PodResources("trainer-0", "team-b", (
        ContainerResources("pytorch", (ContainerDevices("nvidia.com/gpu", ("1",)),
                                       ContainerDevices("rdma/hca", ("mlx5_0",)))),
        ContainerResources("sidecar"),
    )),
    PodResources("infer-0", "team-c", (ContainerResources("server", (
        ContainerDevices("nvidia.com/mig-1g.10gb", (MIG,)),)),)),
    PodResources("dra-0", "team-d", (ContainerResources("main", dynamic_resources=(
        DynamicResource("gpu", "team-d", (
            ClaimResource(("k8s.gpu.nvidia.com/claim=41a2-gpu-2",), "gpu.nvidia.com", "node-1",
                          "gpu-2"),
            ClaimResource((), "gpu.nvidia.com", "node-1", "opaque-name"),
        )),)),)),
]


def gpu_info(count: int = 4, mig: bool = True) -> list[GaugeMetricFamily]:
    """The GPU collector's info families for ``count`` GPUs (and GPU 3's MIG instance)."""
    info = GaugeMetricFamily("trainmon_gpu_info", "GPUs",
                             labels=["gpu", "uuid", "name", "pci_bus_id", "driver_version"])
    for index in range(count):
        info.add_metric([str(index), GPU[index], "H100", f"0000:0{index}:00.0", "570"], 1.0)
    instances = GaugeMetricFamily("trainmon_gpu_mig_info", "MIG instances",
                                  labels=["gpu", "uuid", "gpu_instance_id", "mig_profile"])
    if mig:
        instances.add_metric(["3", MIG, "1", "1g.10gb"], 1.0)
    return [info, instances]


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    # a short folder: a unix socket path holds at most 107 bytes
    folder = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
    try:
        with fake_kubelet(folder) as server:
            server.pods = list(PODS)
            server.allocatable = AllocatableResources(
                (ContainerDevices("nvidia.com/gpu", tuple(GPU[:3])),
                 ContainerDevices("nvidia.com/mig-1g.10gb", (MIG,))), (0, 1))
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def collector_for(kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree,
                  processes: dict[int, list[SimpleNamespace]] | None = None,
                  limits: PodResourcesLimits | None = None, deadline: float = 2.0,
                  pods: KubeletPodDirectory | None = None,
                  config: AttributionConfig | None = None,
                  interval: float = 5.0) -> tuple[AttributionCollector, PodResourcesPoller]:
    """The collector with its poller of ``kubelet`` (``interval`` matters once started)."""
    poller = PodResourcesPoller(
        PodResourcesClient(kubelet.socket, deadline_seconds=deadline,
                           max_response_bytes=(limits or PodResourcesLimits()).max_response_bytes),
        interval_seconds=interval, limits=limits)
    collector = AttributionCollector(config or AttributionConfig(nccl_checks=False), proc.root,
                                     sys_tree.root, lambda: processes or {}, pods=pods,
                                     pod_resources=poller)
    return collector, poller


def poll_and_scrape(collector: tuple[AttributionCollector, PodResourcesPoller],
                    mig: bool = True) -> Scrape:
    """One poll on this thread, then a scrape after the GPU collector's families."""
    collector, poller = collector
    poller.poll()
    collector.observe(gpu_info(mig=mig))
    return scrape(collector)


def allocations(result: Scrape) -> list[tuple[str, str, str, str, str]]:
    return sorted((row["gpu"], row["uuid"], row["namespace"], row["pod"], row["container"])
                  for row in result.labelsets("trainmon_gpu_allocation_info"))


def test_device_plugin_mig_and_dra_allocations_are_exported(
    kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree
) -> None:
    pair = collector_for(kubelet, proc, sys_tree)
    collector = pair[0]
    result = poll_and_scrape(pair)
    assert allocations(result) == [
        ("0", GPU[0], "team-a", "notebook-0", "jupyter"),  # by UUID, no process on it
        ("1", GPU[1], "team-b", "trainer-0", "pytorch"),   # by index
        ("2", GPU[2], "team-d", "dra-0", "main"),          # a DRA claim's device
        ("3", MIG, "team-c", "infer-0", "server"),         # a MIG instance of GPU 3
    ]
    assert result.value("trainmon_pod_resources_unmapped_devices") == 1  # "opaque-name"
    assert result.value("trainmon_pod_resources_requests_total", call="list", result="ok") == 1
    assert result.value("trainmon_pod_resources_requests_total", call="allocatable",
                        result="ok") == 1
    assert result.value("trainmon_pod_resources_allocatable_devices",
                        resource="nvidia.com/gpu") == 3
    assert result.value("trainmon_pod_resources_allocatable_devices",
                        resource="nvidia.com/mig-1g.10gb") == 1
    health = collector.health()
    assert health["pod_resources_pods"] == 4 and "pod_resources_error" not in health

    kubelet.pods = [notebook(GPU[1])]  # the notebook moved, the rest left: nothing lingers
    assert allocations(poll_and_scrape(pair)) == [
        ("1", GPU[1], "team-a", "notebook-0", "jupyter")]


def test_a_mig_instance_the_gpu_collector_does_not_name_keeps_its_uuid(
    kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree
) -> None:
    kubelet.pods = [PODS[2]]
    result = poll_and_scrape(collector_for(kubelet, proc, sys_tree), mig=False)
    assert allocations(result) == [("", MIG, "team-c", "infer-0", "server")]


class PodList(LoopbackHTTPServer):
    """A loopback kubelet ``/pods`` with the pods' labels."""

    def __init__(self) -> None:
        self.requests = 0
        super().__init__(self._answer)

    def _answer(self, request: Request) -> Reply:
        self.requests += 1
        return Reply.json({"kind": "PodList", "items": [
            {"metadata": {"uid": "u1", "name": "notebook-0", "namespace": "team-a",
                          "labels": {"app.kubernetes.io/name": "jupyter", "team": "a",
                                     "secret-ish": "not exported"}}},
            {"metadata": {"uid": "u2", "name": "other", "namespace": "team-a",
                          "labels": {"team": "z"}}},
        ]})


def test_pod_info_carries_the_allowlisted_labels_of_gpu_pods(
    kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree
) -> None:
    kubelet.pods = [notebook()]
    with PodList() as pod_list:
        config = AttributionConfig(nccl_checks=False,
                                   pod_labels=("app.kubernetes.io/name", "team"))
        pair = collector_for(kubelet, proc, sys_tree, config=config,
                             pods=KubeletPodDirectory(pod_list.url))
        result = poll_and_scrape(pair)
        result = poll_and_scrape(pair)
    assert result.labelsets("trainmon_pod_info") == [{
        "namespace": "team-a", "pod": "notebook-0",
        "label_app_kubernetes_io_name": "jupyter", "label_team": "a"}]
    assert pod_list.requests == 1  # a known pod is not asked for again


def test_pod_labels_are_bounded_and_must_stay_distinct() -> None:
    config = parse_config({"collectors": {"attribution": {
        "pod_labels": ["team", "team", "app"], "pod_resources_socket": ""}}})
    assert config.collectors.attribution.pod_labels == ("team", "app")
    with pytest.raises(ConfigError, match=r"collectors\.attribution\.pod_labels"):
        parse_config({"collectors": {"attribution": {"pod_labels": ["a.b", "a/b"]}}})
    with pytest.raises(ConfigError, match="at most 16"):
        parse_config({"collectors": {"attribution": {
            "pod_labels": [f"l{i}" for i in range(17)]}}})


def test_a_slow_kubelet_never_holds_the_scrape(
    kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree
) -> None:
    collector, poller = collector_for(kubelet, proc, sys_tree, deadline=0.3, interval=0.05)
    collector.start()
    try:
        assert poller.wait_for_polls(1, timeout=10)
        kubelet.mode = "slow"
        assert kubelet.wait_for_calls("List", kubelet.calls["List"] + 2)  # one hangs now
        started = time.monotonic()
        collector.observe(gpu_info())
        result = scrape(collector)
        assert time.monotonic() - started < 0.25
        # the last good answer is dropped once older than a few intervals
        assert poller.wait_for_polls(poller.state().polls + 4, timeout=10)
        result = scrape(collector)
    finally:
        collector.stop()
    assert allocations(result) == []
    assert (result.value("trainmon_pod_resources_requests_total", call="list",
                         result="timeout") or 0) >= 2
    health = collector.health()
    assert health["state"] == "degraded"
    assert "DEADLINE_EXCEEDED" in str(health["pod_resources_error"])


def test_garbage_and_a_kubelet_that_goes_away_are_counted_and_told(
    kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree, caplog: pytest.LogCaptureFixture
) -> None:
    pair = collector_for(kubelet, proc, sys_tree)
    collector = pair[0]
    kubelet.mode = "garbage"
    result = poll_and_scrape(pair)
    assert result.value("trainmon_pod_resources_requests_total", call="list",
                        result="invalid") == 1
    assert "not a valid answer" in str(collector.health()["pod_resources_error"])

    kubelet.mode = "ok"
    assert len(allocations(poll_and_scrape(pair))) == 4
    assert "pod_resources_error" not in collector.health()

    kubelet.stop()
    result = poll_and_scrape(pair)
    assert len(allocations(result)) == 4  # one failed poll keeps the last answer
    assert result.value("trainmon_pod_resources_requests_total", call="list",
                        result="unavailable") == 1
    assert "UNAVAILABLE" in str(collector.health()["pod_resources_error"])
    assert "GPU allocations" in caplog.text

    kubelet.start()  # back: the next poll connects afresh
    assert len(allocations(poll_and_scrape(pair))) == 4
    assert "pod_resources_error" not in collector.health()


def test_the_first_call_after_a_kubelet_restart_connects_afresh(kubelet: FakeKubelet) -> None:
    # gRPC's process-wide subchannel pool would hand the new channel the old one's
    # connection in back-off, failing fast with the stale "No such file" error
    client = PodResourcesClient(kubelet.socket)
    try:
        for _ in range(25):
            client.call(LIST_METHOD)
            kubelet.stop()
            with pytest.raises(PodResourcesError):
                client.call(LIST_METHOD)
            kubelet.start()
        client.call(LIST_METHOD)
    finally:
        client.close()


def test_a_kubelet_that_starts_after_the_daemon_is_read_once_its_socket_appears(
        proc: ProcTree, sys_tree: SysTree, caplog: pytest.LogCaptureFixture) -> None:
    # the node boots trainmon before its kubelet: the default socket is not there yet
    caplog.set_level(logging.INFO, logger="trainmon.collectors.attribution")
    folder = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
    late = FakeKubelet(folder)
    late.pods = list(PODS)
    config = AttributionConfig(nccl_checks=False, pod_resources_socket=str(late.socket),
                               pod_resources_interval_seconds=0.1)
    collector = AttributionCollector.from_config(config, proc.root, sys_tree.root, dict,
                                                 default_socket=late.socket)
    collector.start()
    try:
        collector.observe(gpu_info())
        assert allocations(scrape(collector)) == []
        assert collector.health()["pod_resources_awaited"] == str(late.socket)
        assert "pod_resources_error" not in collector.health()  # waiting is no error
        late.start()
        deadline = time.monotonic() + 30
        while len(allocations(scrape(collector))) != 4:  # adopted, then its first poll
            assert time.monotonic() < deadline, collector.health()
            time.sleep(0.05)
            collector.observe(gpu_info())
        assert collector.health()["pod_resources_socket"] == str(late.socket)
        assert "pod-resources socket" in caplog.text and "appeared" in caplog.text
    finally:
        collector.stop()
        late.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_an_old_kubelet_without_allocatable_resources_still_lists(
    kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree
) -> None:
    kubelet.mode = "unimplemented"
    result = poll_and_scrape(collector_for(kubelet, proc, sys_tree))
    assert len(allocations(result)) == 4
    assert result.value("trainmon_pod_resources_requests_total", call="allocatable",
                        result="unimplemented") == 1
    assert result.labelsets("trainmon_pod_resources_allocatable_devices") == []


def test_limits_on_the_answer(kubelet: FakeKubelet, proc: ProcTree, sys_tree: SysTree) -> None:
    pair = collector_for(kubelet, proc, sys_tree,
                         limits=PodResourcesLimits(max_pods=2, devices_per_container=8))
    result = poll_and_scrape(pair)
    assert [row[3] for row in allocations(result)] == ["notebook-0", "trainer-0"]
    assert result.value("trainmon_pod_resources_dropped_total", limit="pods") == 2

    kubelet.pods = [PodResources("big", "ns", (ContainerResources("c", (ContainerDevices(
        "nvidia.com/gpu", tuple(f"GPU-{i:060d}" for i in range(100))),)),))]
    small = collector_for(kubelet, proc, sys_tree,
                          limits=PodResourcesLimits(max_response_bytes=4096))
    result = poll_and_scrape(small)
    assert result.value("trainmon_pod_resources_requests_total", call="list",
                        result="too_large") == 1
    assert allocations(result) == []


def test_without_the_socket_grpc_is_never_imported(tmp_path: Path) -> None:
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "from trainmon.collectors.attribution import AttributionCollector, AttributionConfig\n"
        "for socket in ('', '/var/lib/kubelet/pod-resources/kubelet.sock'):\n"
        "    c = AttributionCollector.from_config(AttributionConfig(pod_resources_socket=socket),\n"
        "                                         Path('/proc'), Path('/sys'), dict)\n"
        "    c.start(); list(c.collect()); c.stop()\n"
        "    assert 'pod_resources_socket' not in c.health(), c.health()\n"
        "print('grpc' in sys.modules)\n"
    )
    if Path("/var/lib/kubelet/pod-resources/kubelet.sock").exists():
        pytest.skip("this machine runs a kubelet")
    completed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                               timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "False"
