"""A GPU the kubelet allocated to a pod that runs nothing on it is held by that pod.

The diagnosis reads ``trainmon_gpu_allocation_info`` (the kubelet's pod-resources
API, exported by the attribution collector) beside NVML's processes: an idle
allocated GPU no process holds gives the pod's pseudo-job ``idle_held``, worded
for an allocation (there is no pid to name).
"""

from __future__ import annotations

from tests.diagnosis.diagnosis_support import Node, findings, healthy_job, job_verdicts
from trainmon.report.messages import finding_text


def allocate(node: Node, gpu: str, pod: str, namespace: str = "research") -> None:
    node.source.set("trainmon_gpu_allocation_info", 1, gpu=gpu, uuid=f"GPU-{gpu}", pod=pod,
                    namespace=namespace, container="main")


def test_an_idle_gpu_allocated_to_a_pod_without_a_process_is_held_idle() -> None:
    node = Node()
    healthy_job(node, ranks=2)
    node.gpus.update({"6": 0.0, "7": 0.0})
    allocate(node, "6", "notebook-x")  # reserved, nothing runs on it
    allocate(node, "7", "loader")      # a process holds this one: NVML's word wins
    node.source.set("trainmon_gpu_process_info", 1, gpu="7", pid="888", pod="loader",
                    namespace="research", container="main", slurm_job="", pod_uid="u2",
                    container_id="")
    allocate(node, "0", "llm-0", namespace="ml")  # the reporting job's own GPU
    result = node.run()
    assert job_verdicts(result) == {
        "llm": "compute",
        "pod:research/notebook-x": "scheduling",
        "pod:research/loader": "scheduling",
    }
    assert findings(result, "pod:research/notebook-x") == {"idle_held"}
    assert findings(result, "pod:research/loader") == {"idle_held"}


def test_the_finding_names_the_allocation_when_no_pid_holds_the_gpu() -> None:
    assert finding_text("idle_held", {"gpus": "6", "pids": "", "threshold": 0.05}, "en") == (
        "GPU(s) 6 are allocated to the pod by the kubelet, and no process runs on them")
    assert "kubelet" in finding_text("idle_held", {"gpus": "6", "pids": ""}, "zh")
    assert "pid(s) 888" in finding_text("idle_held", {"gpus": "7", "pids": "888"}, "en")
