"""The dcgm-exporter dashboard's queries on the DCGM-compatible pack, end to end.

A real ``trainmon serve`` on the fake NVML (three H100s: GPU 0 busy with GPM, an
XID and a process of pod ``ml/trainer-0``; GPU 1 allocated to pod
``team-a/notebook-0`` that runs nothing on it; GPU 2 idle, no pod) is scraped every
second by a real Prometheus that evaluates ``alerts/dcgm-compat/dcgm-compat.rules.yml``
every second. The pods come the ways they do on a node: for GPU 0 the process's
cgroup in a ``/proc`` tree (``paths.proc``) names the pod's UID and a loopback
kubelet's pod list its name; for GPU 1 the kubelet's pod-resources API
(``testkit.fake_kubelet``, a real gRPC server) names the allocation. Every panel query of NVIDIA's "DCGM Exporter Dashboard" (grafana.com
12239), with its template variables resolved as Grafana does, returns data with
dcgm-exporter's labels and values in DCGM's units.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.daemon import Daemon
from testkit.fake_kubelet import FakeKubelet, fake_kubelet
from testkit.loopback import LoopbackHTTPServer, Reply, Request
from testkit.prometheus import Prometheus
from tests.alerts.alerts_support.bundle import REPO
from tests.diagnosis.diagnosis_support import ProcTree
from trainmon.attribution.podresources_wire import (
    ContainerDevices,
    ContainerResources,
    PodResources,
)

pytestmark = pytest.mark.integration

PACK = REPO / "alerts" / "dcgm-compat" / "dcgm-compat.rules.yml"
NODE = "gpu-node-7"
POD_UID = "7d1c3d4e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"
CONTAINER_ID = "3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e"
PID = 4242
SCENARIO = f"""gpus 3
steady 0 80 5
steady 1 0 0
steady 2 0 0
gpm 0 70 50 40 30
process 0 {PID} 21474836480
xid 0 3 79
"""
POD_LIST = {"kind": "PodList", "items": [{
    "metadata": {"uid": POD_UID, "name": "trainer-0", "namespace": "ml"},
    "status": {"containerStatuses": [
        {"name": "pytorch", "containerID": f"containerd://{CONTAINER_ID}"}]},
}]}
#: The panel queries of NVIDIA's "DCGM Exporter Dashboard" (grafana.com 12239), as
#: NVIDIA/dcgm-exporter grafana/dcgm-exporter-dashboard.json has them (commit d5e5f51):
#: panel title, expression. Its variables: $instance = label_values(DCGM_FI_DEV_GPU_TEMP,
#: instance), $gpu = label_values(DCGM_FI_DEV_GPU_TEMP, gpu), both multi-value with All.
DASHBOARD_12239 = (
    ("GPU Temperature", 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Avg. Temp", 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})'),
    ("GPU Power Usage", 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Power Total", 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})'),
    ("GPU SM Clocks", 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000'),
    ("GPU Utilization", 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Framebuffer Mem Used", 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}'),
    ("Tensor Core Utilization",
     'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}'),
)
#: What each panel's values must lie in (DCGM's units: °C, W, Hz after × 10⁶, %, MiB, 0–1).
PANEL_RANGES = {
    "GPU Temperature": (1, 120), "GPU Avg. Temp": (1, 120),
    "GPU Power Usage": (1, 1500), "GPU Power Total": (1, 3000),
    "GPU SM Clocks": (1e8, 4e9), "GPU Utilization": (0, 100),
    "GPU Framebuffer Mem Used": (0, 200_000), "Tensor Core Utilization": (0, 1),
}
#: GPU 1 as the device plugin allocated it (by index): a notebook that runs nothing.
ALLOCATION = PodResources("notebook-0", "team-a", (ContainerResources(
    "jupyter", (ContainerDevices("nvidia.com/gpu", ("1",)),)),))
DCGM_LABELS = {"gpu", "UUID", "modelName", "Hostname"}
DEADLINE_SECONDS = 30.0


class Kubelet(LoopbackHTTPServer):
    """A loopback kubelet serving the node's pod list at ``/pods``."""

    def __init__(self) -> None:
        super().__init__(self._answer)

    @staticmethod
    def _answer(request: Request) -> Reply:
        return Reply.json(POD_LIST) if request.path == "/pods" else Reply.json({}, status=404)


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    with Kubelet() as server:
        yield server


@pytest.fixture
def pod_resources() -> Iterator[FakeKubelet]:
    folder = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))  # socket paths are short
    try:
        with fake_kubelet(folder) as server:
            server.pods = [ALLOCATION]
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def node_daemon(start_daemon: Callable[..., Daemon], fake_nvml_dir: Path, tmp_path: Path,
                kubelet: Kubelet, pod_resources: FakeKubelet) -> Daemon:
    ProcTree(tmp_path / "proc").add(
        PID, cgroup=f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/"
                    f"cri-containerd-{CONTAINER_ID}.scope\n")
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(SCENARIO)
    return start_daemon(
        config={"paths": {"proc": str(tmp_path / "proc")}, "collectors": {
            "gpu": {"process_interval_seconds": 1, "sample_interval_seconds": 0.5},
            "attribution": {"kubelet_url": kubelet.url,
                            "pod_resources_socket": str(pod_resources.socket),
                            "pod_resources_interval_seconds": 0.5}}},
        env={"LD_LIBRARY_PATH": str(fake_nvml_dir), "FAKENVML_SCENARIO": str(scenario)})


def expand(expr: str, variables: dict[str, list[str]]) -> str:
    """``expr`` with ``$name`` replaced as Grafana does for a multi-value regex variable:
    each value regex-escaped, its backslashes doubled for the PromQL string."""
    return re.sub(r"\$(\w+)", lambda m: "(" + "|".join(
        re.escape(value).replace("\\", "\\\\") for value in variables[m.group(1)]) + ")",
        expr)


def wait_for(prometheus: Prometheus, expr: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        result = prometheus.query(expr)
        if len(result) >= count:
            return result
        assert time.monotonic() < deadline, f"{expr}: {result}\n{prometheus.log()}"
        time.sleep(0.5)


def test_dashboard_12239_queries_return_dcgm_series(
    node_daemon: Daemon, prometheus: Prometheus
) -> None:
    prometheus.start({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PACK)],
        "scrape_configs": [{
            "job_name": "trainmon", "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{node_daemon.port}"],
                                "labels": {"node": NODE}}],
        }],
    })
    # the pods reach the series once the process list and the kubelet have been read
    wait_for(prometheus, 'DCGM_FI_DEV_XID_ERRORS{pod="trainer-0"} == 79', 1)
    wait_for(prometheus, 'DCGM_FI_DEV_XID_ERRORS{pod="notebook-0"}', 1)
    series = wait_for(prometheus, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1)
    now = time.time()
    variables = {
        name: prometheus.label_values(name, "DCGM_FI_DEV_GPU_TEMP", now - 60, now)
        for name in ("instance", "gpu")
    }
    assert variables == {"instance": [f"127.0.0.1:{node_daemon.port}"],
                         "gpu": ["0", "1", "2"]}

    for title, expr in DASHBOARD_12239:
        result = prometheus.query(expand(expr, variables))
        assert result, f"{title}: {expr} returned nothing"
        low, high = PANEL_RANGES[title]
        for sample in result:
            assert low <= float(sample["value"][1]) <= high, (title, sample)
            labels = sample["metric"]
            if labels:  # the aggregating panels (avg, sum) have none
                assert labels.keys() >= DCGM_LABELS, (title, labels)
                assert labels["Hostname"] == NODE
                assert labels["modelName"] == "NVIDIA H100 80GB HBM3"

    by_gpu = {s["metric"]["gpu"]: s["metric"] for s in prometheus.query("DCGM_FI_DEV_GPU_UTIL")}
    assert by_gpu.keys() == {"0", "1", "2"}
    pods = {gpu: (labels.get("pod"), labels.get("namespace"), labels.get("container"))
            for gpu, labels in by_gpu.items()}
    assert pods == {"0": ("trainer-0", "ml", "pytorch"),  # its process
                    "1": ("notebook-0", "team-a", "jupyter"),  # allocated, nothing running
                    "2": (None, None, None)}
    assert len({labels["UUID"] for labels in by_gpu.values()}) == 3
    # GPM exists on GPU 0 only, as DCGM's profiling fields would
    assert [s["metric"]["gpu"] for s in series] == ["0"]
    xid = {s["metric"]["gpu"]: float(s["value"][1])
           for s in prometheus.query("DCGM_FI_DEV_XID_ERRORS")}
    assert xid == {"0": 79.0, "1": 0.0, "2": 0.0}
    used, free = (float(prometheus.query(f'{name}{{gpu="0"}}')[0]["value"][1])
                  for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"))
    assert (used, free) == (1024.0, 80 * 1024 - 1024.0)  # the fake: GPU i uses i + 1 GiB of 80
