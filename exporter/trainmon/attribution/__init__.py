"""Who uses a GPU: process → Kubernetes pod/namespace/container or Slurm job.

``cgroup`` parses ``/proc/<pid>/cgroup`` paths, ``kubelet`` turns pod UIDs into
names, ``process`` puts both together for one PID.
"""

from trainmon.attribution.kubelet import KubeletPodDirectory, PodNames
from trainmon.attribution.process import ProcessAttribution, ProcessAttributor, read_environ

__all__ = [
    "KubeletPodDirectory",
    "PodNames",
    "ProcessAttribution",
    "ProcessAttributor",
    "read_environ",
]
