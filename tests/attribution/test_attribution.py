"""Attribution: cgroup formats, Slurm, kubelet names, and the collector's info metric.

Fixture ``/proc`` trees hold cgroup files in the exact formats of cgroupfs and
systemd drivers under cgroup v1 and v2, CRI-O, containerd, Docker and Slurm.
The kubelet is a loopback HTTP server serving a ``PodList``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from testkit.exposition import scrape
from testkit.loopback import LoopbackHTTPServer, Reply, Request
from tests.diagnosis.diagnosis_support import ProcTree, SysTree
from trainmon.attribution import KubeletPodDirectory, ProcessAttributor
from trainmon.collectors.attribution import AttributionCollector, AttributionConfig
from trainmon.config import parse_config
from trainmon.section import ConfigError

UID = "7d1c3d4e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"
UID_ = UID.replace("-", "_")
CID = "3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e"
OTHER_CID = "a" * 64

V1_CGROUPFS = f"""12:pids:/kubepods/burstable/pod{UID}/{CID}
11:memory:/kubepods/burstable/pod{UID}/{CID}
4:devices:/kubepods/burstable/pod{UID}/{CID}
1:name=systemd:/kubepods/burstable/pod{UID}/{CID}
0::/
"""
V1_SYSTEMD_CONTAINERD = f"""11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
10:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
"""
V2_SYSTEMD_CRIO = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n"
V2_CGROUPFS_GUARANTEED = f"0::/kubepods/pod{UID}/{CID}\n"
V2_KIND_NESTED = (f"0::/system.slice/containerd.service/"
                  f"kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}\n")
V2_DOCKER_SCOPE = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope\n"
V2_CRIO_CONMON = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope\n"
PLAIN_DOCKER_V2 = f"0::/system.slice/docker-{CID}.scope\n"
PLAIN_HOST = "0::/user.slice/user-1000.slice/session-4.scope\n"
SLURM_V1 = """11:memory:/slurm/uid_1000/job_4242/step_0/task_0
7:devices:/slurm/uid_1000/job_4242/step_0
4:cpuset:/slurm/uid_1000/job_4242/step_0
1:name=systemd:/system.slice/slurmd.service
"""
SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"


@pytest.mark.parametrize(
    ("cgroup", "pod_uid", "container_id"),
    [
        pytest.param(V1_CGROUPFS, UID, CID, id="k8s-v1-cgroupfs"),
        pytest.param(V1_SYSTEMD_CONTAINERD, UID, CID, id="k8s-v1-systemd-containerd"),
        pytest.param(V2_SYSTEMD_CRIO, UID, CID, id="k8s-v2-systemd-crio"),
        pytest.param(V2_CGROUPFS_GUARANTEED, UID, CID, id="k8s-v2-cgroupfs-guaranteed"),
        pytest.param(V2_KIND_NESTED, UID, CID, id="k8s-v2-containerd-nested"),
        pytest.param(V2_DOCKER_SCOPE, UID, CID, id="k8s-v2-dockershim"),
        pytest.param(V2_CRIO_CONMON, UID, "", id="k8s-v2-crio-conmon"),
        pytest.param(PLAIN_DOCKER_V2, "", CID, id="plain-docker"),
        pytest.param(PLAIN_HOST, "", "", id="plain-host"),
    ],
)
def test_kubernetes_and_container_cgroups(
    proc: ProcTree, cgroup: str, pod_uid: str, container_id: str
) -> None:
    proc.add(100, cgroup=cgroup)
    who = ProcessAttributor(proc.root).attribute(100)
    assert (who.pod_uid, who.container_id, who.slurm_job) == (pod_uid, container_id, "")
    assert (who.pod, who.namespace, who.container) == ("", "", "")  # no kubelet configured


@pytest.mark.parametrize("cgroup", [SLURM_V1, SLURM_V2], ids=["slurm-v1", "slurm-v2"])
def test_slurm_job_from_the_cgroup_path(proc: ProcTree, cgroup: str) -> None:
    proc.add(200, cgroup=cgroup, environ={"SLURM_JOB_ID": "999"})
    who = ProcessAttributor(proc.root).attribute(200)
    assert who.slurm_job == "4242"  # the cgroup wins over the environment
    assert who.pod_uid == ""


def test_slurm_job_from_the_environment_without_the_cgroup_plugin(proc: ProcTree) -> None:
    proc.add(201, cgroup=PLAIN_HOST, environ={"SLURM_JOB_ID": "777", "HOME": "/home/a"})
    proc.add(202, cgroup=PLAIN_HOST, environ={"SLURM_JOB_ID": "not-a-number"})
    attributor = ProcessAttributor(proc.root)
    assert attributor.attribute(201).slurm_job == "777"
    assert attributor.attribute(202).slurm_job == ""


def test_a_vanished_process_gives_only_its_pid(proc: ProcTree) -> None:
    who = ProcessAttributor(proc.root).attribute(31337)
    assert (who.pid, who.pod_uid, who.slurm_job, who.environ) == (31337, "", "", None)


def test_unreadable_environ_degrades_to_cgroup_facts(
    proc: ProcTree, sys_tree: SysTree, caplog: pytest.LogCaptureFixture
) -> None:
    directory = proc.add(300, cgroup=SLURM_V2)
    if os.geteuid() == 0:  # root reads any file: an unreadable entry instead (EISDIR)
        (directory / "environ").mkdir()
    else:
        (directory / "environ").write_bytes(b"SLURM_JOB_ID=1\0")
        (directory / "environ").chmod(0)
    collector = AttributionCollector(
        AttributionConfig(), proc.root, sys_tree.root, lambda: {3: [SimpleNamespace(pid=300)]}
    )
    result = scrape(collector)
    assert result.value("trainmon_gpu_process_info", pid="300", slurm_job="4242") == 1
    assert result.value("trainmon_nccl_processes", state="unreadable") == 1
    assert result.value("trainmon_nccl_processes", state="checked") == 0
    assert "cannot read the environment of pid 300" in caplog.text


# -- kubelet ----------------------------------------------------------------------

POD_LIST = {
    "kind": "PodList",
    "items": [
        {
            "metadata": {"uid": UID, "name": "trainer-0", "namespace": "ml"},
            "status": {
                "containerStatuses": [
                    {"name": "pytorch", "containerID": f"containerd://{CID}"},
                    {"name": "sidecar", "containerID": f"containerd://{OTHER_CID}"},
                ],
                "initContainerStatuses": [{"name": "init", "containerID": ""}],
            },
        },
        {"metadata": {"name": "broken"}},
        "not a pod",
    ],
}


class Kubelet(LoopbackHTTPServer):
    """A loopback kubelet that serves ``/pods`` and records each request."""

    def __init__(self) -> None:
        self.document: object = POD_LIST
        self.status = 200
        self.requests: list[dict[str, str]] = []
        super().__init__(self._answer)

    def _answer(self, request: Request) -> Reply:
        self.requests.append({"path": request.path, **request.headers})
        return Reply.json(self.document, status=self.status)


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    with Kubelet() as server:
        yield server


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_kubelet_names_pod_namespace_and_container(
    proc: ProcTree, kubelet: Kubelet, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    proc.add(100, cgroup=V2_SYSTEMD_CRIO)
    pods = KubeletPodDirectory(kubelet.url, token_file=token, clock=Clock())
    who = ProcessAttributor(proc.root, pods).attribute(100)
    assert (who.pod, who.namespace, who.container) == ("trainer-0", "ml", "pytorch")
    assert kubelet.requests[0]["path"] == "/pods"
    assert kubelet.requests[0]["authorization"] == "Bearer secret-token"


def test_kubelet_is_asked_only_for_unknown_pods_and_at_most_once_per_refresh(
    proc: ProcTree, kubelet: Kubelet
) -> None:
    clock = Clock()
    proc.add(100, cgroup=V1_CGROUPFS)
    proc.add(101, cgroup=f"0::/kubepods/burstable/pod{'0' * 8}-0000-0000-0000-{'0' * 12}/{CID}\n")
    pods = KubeletPodDirectory(kubelet.url, refresh_seconds=30, clock=clock)
    attributor = ProcessAttributor(proc.root, pods)
    for _ in range(3):
        assert attributor.attribute(100).pod == "trainer-0"
    assert len(kubelet.requests) == 1  # a known pod is answered from the cache
    assert attributor.attribute(101).pod == ""  # unknown pod: fetch rate-limited
    assert len(kubelet.requests) == 1
    clock.now += 31
    assert attributor.attribute(101).pod == ""
    assert len(kubelet.requests) == 2


def test_kubelet_failure_leaves_names_empty_and_is_counted(
    proc: ProcTree, kubelet: Kubelet, sys_tree: SysTree, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.status = 403
    proc.add(100, cgroup=V1_CGROUPFS)
    collector = AttributionCollector(
        AttributionConfig(nccl_checks=False), proc.root, sys_tree.root,
        lambda: {0: [SimpleNamespace(pid=100)]},
        pods=KubeletPodDirectory(kubelet.url, clock=Clock()),
    )
    result = scrape(collector)
    info = result.labelsets("trainmon_gpu_process_info")
    assert info == [{"gpu": "0", "pid": "100", "pod": "", "namespace": "", "container": "",
                     "slurm_job": "", "pod_uid": UID, "container_id": CID}]
    assert result.value("trainmon_attribution_kubelet_requests_total", result="error") == 1
    assert "403" in collector.health()["kubelet_error"]  # type: ignore[operator]
    assert "cannot list pods from the kubelet" in caplog.text


def test_kubelet_answer_that_is_not_a_pod_list(proc: ProcTree, kubelet: Kubelet) -> None:
    kubelet.document = {"kind": "Status"}
    proc.add(100, cgroup=V1_CGROUPFS)
    pods = KubeletPodDirectory(kubelet.url, clock=Clock())
    assert ProcessAttributor(proc.root, pods).attribute(100).pod == ""
    assert pods.fetches == {"ok": 0, "error": 1}


# -- the collector -------------------------------------------------------------


def test_collector_exports_one_info_sample_per_gpu_and_process(
    proc: ProcTree, sys_tree: SysTree, kubelet: Kubelet
) -> None:
    proc.add(100, cgroup=V1_SYSTEMD_CONTAINERD, environ={})
    proc.add(200, cgroup=SLURM_V2, environ={})
    proc.add(300, cgroup=PLAIN_HOST, environ={})
    processes = {
        0: [SimpleNamespace(pid=100)],
        1: [SimpleNamespace(pid=100), SimpleNamespace(pid=200)],
        2: [SimpleNamespace(pid=300)],
    }
    collector = AttributionCollector.from_config(
        AttributionConfig(kubelet_url=kubelet.url), proc.root, sys_tree.root, lambda: processes
    )
    result = scrape(collector)
    rows = sorted(
        (row["gpu"], row["pid"], row["pod"], row["namespace"], row["container"], row["slurm_job"])
        for row in result.labelsets("trainmon_gpu_process_info")
    )
    assert rows == [
        ("0", "100", "trainer-0", "ml", "pytorch", ""),
        ("1", "100", "trainer-0", "ml", "pytorch", ""),
        ("1", "200", "", "", "", "4242"),
        ("2", "300", "", "", "", ""),
    ]
    assert "trainmon_gpu_process_info{" in result.text
    assert result.value("trainmon_nccl_processes", state="checked") == 3
    assert collector.health()["processes"] == 3

    processes.clear()  # the processes exit: nothing lingers
    assert scrape(collector).labelsets("trainmon_gpu_process_info") == []


def test_attribution_config_is_validated() -> None:
    config = parse_config({"collectors": {"attribution": {
        "kubelet_url": "https://10.0.0.7:10250/", "kubelet_insecure_skip_verify": True}}})
    assert config.collectors.attribution.kubelet_url == "https://10.0.0.7:10250"
    with pytest.raises(ConfigError, match=r"collectors\.attribution\.kubelet_url"):
        parse_config({"collectors": {"attribution": {"kubelet_url": "10.0.0.7:10250"}}})
    with pytest.raises(ConfigError, match=r"collectors\.attribution\.colour"):
        parse_config({"collectors": {"attribution": {"colour": "blue"}}})
