"""Attribution collector: who uses each GPU, and whether their NCCL setup makes sense.

For every compute process on a GPU (the list comes from the GPU side through
an injected callable — ``GPUCollector.processes`` in the daemon, which reads
NVML at most every ``gpu.process_interval_seconds``):

- ``trainmon_gpu_process_info{gpu,pid,pod,namespace,container,slurm_job,pod_uid,container_id}``
  = 1, an info metric to join on ``gpu`` (``* on(gpu) group_left(pod)``);
  identity is never copied onto the GPU series themselves;
- ``trainmon_nccl_problem_info{pid,problem,variable,value}`` = 1 for each
  misconfiguration ``trainmon.diagnosis.nccl`` finds in the process environment
  (``attribution.nccl_checks``);
- ``trainmon_nccl_processes{state}``: processes whose environment was
  ``checked`` or ``unreadable`` (needs ``CAP_SYS_PTRACE`` or the same user);
- ``trainmon_attribution_kubelet_requests_total{result}`` when a kubelet is
  configured.

Sources are documented in ``trainmon.attribution`` and ``trainmon.diagnosis.nccl``;
docs/diagnosis.md explains the deployment requirements (host PID view, kubelet
RBAC).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainmon.attribution import KubeletPodDirectory, ProcessAttribution, ProcessAttributor
from trainmon.collectors.gpu import GPUCollector
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.diagnosis.nccl import check_environment, read_interfaces, read_rdma_ports
from trainmon.node.kernelfiles import KernelFileReader
from trainmon.section import setting

log = logging.getLogger(__name__)

PROCESS_LABELS = [
    "gpu", "pid", "pod", "namespace", "container", "slurm_job", "pod_uid", "container_id",
]


def _kubelet_url(url: str) -> str:
    if not re.fullmatch(r"https?://[^/\s]+/?", url):
        raise ValueError(f"expected http(s)://host:port, got {url!r}")
    return url.rstrip("/")


@dataclass(frozen=True)
class AttributionConfig:
    """The ``collectors.attribution`` section: GPU process → pod/namespace/container
    or Slurm job (docs/diagnosis.md)."""

    enabled: bool = True
    #: Kubelet base URL for pod names (``https://$(NODE_IP):10250``); None: pod UIDs only.
    kubelet_url: str | None = field(default=None, metadata=setting(parse=_kubelet_url))
    #: Bearer token file for the kubelet (a service account token, re-read on use).
    kubelet_token_file: Path | None = None
    kubelet_ca_file: Path | None = None
    kubelet_insecure_skip_verify: bool = False
    #: The pod list is fetched on an unknown pod, at most once per this many seconds.
    kubelet_refresh_seconds: float = field(default=30.0, metadata=setting(minimum=1, maximum=3600))
    kubelet_timeout_seconds: float = field(default=5.0, metadata=setting(minimum=0.1, maximum=60))
    #: Check GPU processes' NCCL_* environment (trainmon_nccl_problem_info).
    nccl_checks: bool = True


class GPUProcessLike(Protocol):
    """What the attribution needs of a GPU process (``trainmon.gpu.types.GPUProcess``)."""

    @property
    def pid(self) -> int: ...


#: GPU index → compute processes on it.
GPUProcessSource = Callable[[], Mapping[int, Sequence[GPUProcessLike]]]


class AttributionCollector(Collector):
    """Exports ``trainmon_gpu_process_info`` and the NCCL sanity checks."""

    name = "attribution"

    def __init__(
        self,
        config: AttributionConfig,
        proc_root: Path,
        sys_root: Path,
        gpu_processes: GPUProcessSource,
        *,
        pods: KubeletPodDirectory | None = None,
    ) -> None:
        self._config = config
        self._proc = proc_root
        self._sys = sys_root
        self._gpu_processes = gpu_processes
        self._pods = pods
        self._attributor = ProcessAttributor(proc_root, pods)
        self._files = KernelFileReader(log)
        self._last_counts: dict[str, int] = {"processes": 0}

    @classmethod
    def from_config(
        cls, config: AttributionConfig, proc_root: Path, sys_root: Path,
        gpu_processes: GPUProcessSource,
    ) -> AttributionCollector:
        """The collector with a kubelet pod directory when ``kubelet_url`` is set."""
        pods = None
        if config.kubelet_url is not None:
            pods = KubeletPodDirectory(
                config.kubelet_url,
                token_file=config.kubelet_token_file,
                ca_file=config.kubelet_ca_file,
                insecure_skip_verify=config.kubelet_insecure_skip_verify,
                refresh_seconds=config.kubelet_refresh_seconds,
                timeout_seconds=config.kubelet_timeout_seconds,
            )
        return cls(config, proc_root, sys_root, gpu_processes, pods=pods)

    @property
    def attributor(self) -> ProcessAttributor:
        """Who runs a process (with the kubelet's pod names when configured)."""
        return self._attributor

    def health(self) -> Mapping[str, object]:
        state: dict[str, object] = dict(self._last_counts)
        if self._pods is not None:
            state["kubelet_url"] = self._pods.url
            state["kubelet_pods"] = self._pods.pod_count
            if self._pods.last_error is not None:
                state["kubelet_error"] = self._pods.last_error
        return state

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            "trainmon_gpu_process_info",
            "A compute process on a GPU and who runs it (Kubernetes pod/namespace/container "
            "from /proc/<pid>/cgroup and the kubelet, Slurm job from the cgroup path or "
            "SLURM_JOB_ID); empty where unknown; always 1.",
            labels=PROCESS_LABELS,
        )
        attributed: dict[int, ProcessAttribution] = {}
        for gpu, processes in sorted(self._gpu_processes().items()):
            for process in processes:
                pid = int(process.pid)
                who = attributed.get(pid)
                if who is None:
                    who = attributed[pid] = self._attributor.attribute(pid)
                info.add_metric([
                    str(gpu), str(pid), who.pod, who.namespace, who.container, who.slurm_job,
                    who.pod_uid, who.container_id,
                ], 1.0)
        families: list[Metric] = [info]
        if self._config.nccl_checks:
            families.extend(self._nccl_families(attributed.values()))
        if self._pods is not None:
            requests = CounterMetricFamily(
                "trainmon_attribution_kubelet_requests_total",
                "Pod list requests to the kubelet (for pod and container names), by result.",
                labels=["result"],
            )
            for result, count in self._pods.fetches.items():
                requests.add_metric([result], count)
            families.append(requests)
        self._last_counts = {"processes": len(attributed)}
        return families

    def _nccl_families(self, processes: Iterable[ProcessAttribution]) -> list[Metric]:
        problems = GaugeMetricFamily(
            "trainmon_nccl_problem_info",
            "An NCCL misconfiguration in a GPU process's environment (docs/diagnosis.md lists "
            "the problems); variable and value name the setting at fault; always 1.",
            labels=["pid", "problem", "variable", "value"],
        )
        counts = GaugeMetricFamily(
            "trainmon_nccl_processes",
            "GPU processes whose environment was checked for NCCL problems, or could not be "
            "read (unreadable: the daemon lacks CAP_SYS_PTRACE or the process's user).",
            labels=["state"],
        )
        checked = unreadable = 0
        rdma_ports = None
        for who in processes:
            if who.environ is None:
                unreadable += 1
                continue
            checked += 1
            if rdma_ports is None:
                rdma_ports = read_rdma_ports(self._sys, self._files)
            interfaces = read_interfaces(self._proc, who.pid, self._sys)
            for problem in check_environment(who.environ, rdma_ports, interfaces):
                problems.add_metric(
                    [str(who.pid), problem.problem, problem.variable, problem.value], 1.0
                )
        counts.add_metric(["checked"], checked)
        counts.add_metric(["unreadable"], unreadable)
        return [problems, counts]


def _build(config: AttributionConfig, wiring: Wiring) -> Collector:
    gpu = wiring.collector("gpu", GPUCollector)
    return AttributionCollector.from_config(
        config, wiring.proc_root, wiring.sys_root, gpu.processes
    )


ENTRY = CollectorEntry(
    "attribution", AttributionConfig, _build, derived=True, requires=("gpu",)
)
