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

With the kubelet's pod-resources socket (``pod_resources_socket``, by default the
kubelet's own path once it exists: a daemon that starts before the kubelet looks for
it at most once per ``pod_resources_interval_seconds``, on the scrape), a background poller
(``trainmon.attribution.podresources``) reads which GPUs each container was
allocated, by the device plugin or by DRA, process or not:

- ``trainmon_gpu_allocation_info{gpu,uuid,pod,namespace,container}`` = 1, the GPUs
  mapped to the GPU collector's index and UUID (read from ``trainmon_gpu_info``, and
  from any ``trainmon_gpu*_info`` family that has both labels: MIG instances);
- ``trainmon_pod_resources_requests_total{call,result}``,
  ``trainmon_pod_resources_dropped_total{limit}``,
  ``trainmon_pod_resources_unmapped_devices`` and
  ``trainmon_pod_resources_allocatable_devices{resource}``.

``trainmon_pod_info{namespace,pod,label_<name>...}`` = 1 carries the pod labels of
``pod_labels`` for the pods that hold or were allocated a GPU (from the kubelet's pod
list, ``kubelet_url``).

Sources are documented in ``trainmon.attribution`` and ``trainmon.diagnosis.nccl``;
docs/diagnosis.md explains the deployment requirements (host PID view, kubelet
RBAC).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainmon.attribution import KubeletPodDirectory, ProcessAttribution, ProcessAttributor
from trainmon.attribution.podresources import (
    DEFAULT_SOCKET,
    GpuAllocation,
    GpuDirectory,
    PodResourcesClient,
    PodResourcesPoller,
    allocatable_gpus,
    gpu_allocations,
)
from trainmon.attribution.podresources_wire import LIMITS
from trainmon.collectors.gpu import GPUCollector
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.diagnosis.nccl import check_environment, read_interfaces, read_rdma_ports
from trainmon.node.kernelfiles import KernelFileReader
from trainmon.section import setting

log = logging.getLogger(__name__)

PROCESS_LABELS = [
    "gpu", "pid", "pod", "namespace", "container", "slurm_job", "pod_uid", "container_id",
]


#: Most pod labels ``trainmon_pod_info`` carries (``pod_labels``).
MAX_POD_LABELS = 16
ALLOCATION_LABELS = ["gpu", "uuid", "pod", "namespace", "container"]
_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _pod_labels(names: tuple[str, ...]) -> tuple[str, ...]:
    if len(names) > MAX_POD_LABELS:
        raise ValueError(f"at most {MAX_POD_LABELS} pod labels, got {len(names)}")
    kept = tuple(dict.fromkeys(name for name in names if name))
    labels = [label_name(name) for name in kept]
    if len(set(labels)) < len(labels):
        raise ValueError(f"two pod labels make the same Prometheus label: {labels}")
    return kept


def label_name(pod_label: str) -> str:
    """The Prometheus label of a pod label: ``app.kubernetes.io/name`` →
    ``label_app_kubernetes_io_name`` (kube-state-metrics' convention)."""
    return "label_" + _LABEL_NAME.sub("_", pod_label)


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
    #: The kubelet's pod-resources socket (trainmon_gpu_allocation_info): the default is
    #: used once it exists (a kubelet that starts after the daemon); "" disables.
    pod_resources_socket: str = str(DEFAULT_SOCKET)
    pod_resources_interval_seconds: float = field(
        default=10.0, metadata=setting(minimum=0.1, maximum=3600))
    pod_resources_timeout_seconds: float = field(
        default=2.0, metadata=setting(minimum=0.1, maximum=30))
    #: Pod labels exported on trainmon_pod_info as label_<name> (needs kubelet_url).
    pod_labels: tuple[str, ...] = field(default=(), metadata=setting(parse=_pod_labels))


class GPUProcessLike(Protocol):
    """What the attribution needs of a GPU process (``trainmon.gpu.types.GPUProcess``)."""

    @property
    def pid(self) -> int: ...


#: GPU index → compute processes on it.
GPUProcessSource = Callable[[], Mapping[int, Sequence[GPUProcessLike]]]


def _poller(config: AttributionConfig, socket: Path) -> PodResourcesPoller:
    return PodResourcesPoller(
        PodResourcesClient(socket, deadline_seconds=config.pod_resources_timeout_seconds),
        interval_seconds=config.pod_resources_interval_seconds,
    )


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
        pod_resources: PodResourcesPoller | None = None,
    ) -> None:
        self._config = config
        self._proc = proc_root
        self._sys = sys_root
        self._gpu_processes = gpu_processes
        self._pods = pods
        self._attributor = ProcessAttributor(proc_root, pods)
        self._files = KernelFileReader(log)
        self._last_counts: dict[str, int] = {"processes": 0}
        self._pod_resources = pod_resources
        self._gpus = GpuDirectory()
        #: The kubelet's default socket, not there yet: adopted once it appears.
        self._awaited_socket: Path | None = None
        self._next_look = 0.0
        self._running = False
        self._lock = threading.Lock()

    @classmethod
    def from_config(
        cls, config: AttributionConfig, proc_root: Path, sys_root: Path,
        gpu_processes: GPUProcessSource, *, default_socket: Path = DEFAULT_SOCKET,
    ) -> AttributionCollector:
        """The collector with a kubelet pod directory when ``kubelet_url`` is set, and a
        pod-resources poller of ``pod_resources_socket``; the kubelet's own
        ``default_socket`` is awaited while it does not exist."""
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
        socket = config.pod_resources_socket
        awaited = socket == str(default_socket) and not default_socket.exists()
        poller = _poller(config, Path(socket)) if socket and not awaited else None
        collector = cls(config, proc_root, sys_root, gpu_processes, pods=pods,
                        pod_resources=poller)
        if awaited:
            collector._awaited_socket = default_socket
        return collector

    def start(self) -> None:
        with self._lock:
            self._running = True
            if self._pod_resources is not None:
                self._pod_resources.start()

    def stop(self) -> None:
        with self._lock:
            self._running = False
            if self._pod_resources is not None:
                self._pod_resources.stop()

    def _look_for_the_kubelet(self) -> None:
        """Adopt the kubelet's default socket once it exists (a node whose kubelet starts
        after trainmon), looking at most once per ``pod_resources_interval_seconds``."""
        now = time.monotonic()
        if self._awaited_socket is None or now < self._next_look:
            return
        self._next_look = now + self._config.pod_resources_interval_seconds
        if not self._awaited_socket.exists():
            return
        with self._lock:
            poller = _poller(self._config, self._awaited_socket)
            log.info("the kubelet's pod-resources socket %s appeared: reading GPU "
                     "allocations from it", self._awaited_socket)
            self._awaited_socket = None
            if self._running:
                poller.start()
            self._pod_resources = poller

    def observe(self, families: Sequence[Metric]) -> None:
        """The GPUs' indices and UUIDs, from the GPU collector's info families."""
        self._look_for_the_kubelet()
        if self._pod_resources is None:
            return
        index_of: dict[str, str] = {}
        uuid_of: dict[str, str] = {}
        for family in families:
            if not (family.name.startswith("trainmon_gpu") and family.name.endswith("_info")):
                continue
            for sample in family.samples:
                gpu, uuid = sample.labels.get("gpu"), sample.labels.get("uuid")
                if gpu and uuid:
                    index_of.setdefault(uuid, gpu)
                    if family.name == "trainmon_gpu_info":
                        uuid_of[gpu] = uuid
        self._gpus = GpuDirectory(index_of, uuid_of)

    @property
    def attributor(self) -> ProcessAttributor:
        """Who runs a process (with the kubelet's pod names when configured)."""
        return self._attributor

    def allocations(self) -> list[GpuAllocation]:
        """The GPUs the kubelet allocated to containers now (empty without the socket):
        the poller's latest answer, mapped to the GPUs of the latest scrape."""
        if self._pod_resources is None:
            return []
        return gpu_allocations(self._pod_resources.state().pods, self._gpus)[0]

    def health(self) -> Mapping[str, object]:
        state: dict[str, object] = dict(self._last_counts)
        if self._pods is not None:
            state["kubelet_url"] = self._pods.url
            state["kubelet_pods"] = self._pods.pod_count
            if self._pods.last_error is not None:
                state["kubelet_error"] = self._pods.last_error
        if self._awaited_socket is not None:
            state["pod_resources_awaited"] = str(self._awaited_socket)
        if self._pod_resources is not None:
            resources = self._pod_resources.state()
            state["pod_resources_socket"] = str(self._pod_resources.client.socket)
            state["pod_resources_pods"] = len(resources.pods)
            if resources.error is not None:
                state["pod_resources_error"] = resources.error
                state["state"] = "degraded"
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
        holders = {(who.namespace, who.pod) for who in attributed.values() if who.pod}
        if self._pod_resources is not None:
            families.extend(self._allocation_families(holders))
        if self._config.pod_labels and self._pods is not None:
            families.append(self._pod_info(holders))
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

    def _allocation_families(self, holders: set[tuple[str, str]]) -> list[Metric]:
        """The pod-resources poller's latest answer (never waits on the kubelet); adds the
        allocated pods to ``holders``."""
        assert self._pod_resources is not None
        resources = self._pod_resources.state()
        allocations, unmapped = gpu_allocations(resources.pods, self._gpus)
        info = GaugeMetricFamily(
            "trainmon_gpu_allocation_info",
            "A GPU (or MIG instance) the kubelet allocated to a container, by the device "
            "plugin or DRA, whether or not a process runs on it (the pod-resources API); "
            "gpu is the GPU collector's index, empty where it cannot be told; always 1.",
            labels=ALLOCATION_LABELS,
        )
        for allocation in allocations:
            info.add_metric([allocation.gpu, allocation.uuid, allocation.pod,
                             allocation.namespace, allocation.container], 1.0)
            holders.add((allocation.namespace, allocation.pod))
        requests = CounterMetricFamily(
            "trainmon_pod_resources_requests_total",
            "Calls to the kubelet's pod-resources API, by call (list, allocatable) and "
            "result (ok, timeout, unavailable, too_large, invalid, unimplemented, error, "
            "no_grpc).",
            labels=["call", "result"],
        )
        for (call, result), count in sorted(self._pod_resources.requests().items()):
            requests.add_metric([call, result], count)
        dropped = CounterMetricFamily(
            "trainmon_pod_resources_dropped_total",
            "Pods, containers per pod or devices per container of the kubelet's answers "
            "dropped past their limit (docs/security.md).",
            labels=["limit"],
        )
        counts = self._pod_resources.dropped()
        for limit in LIMITS:
            dropped.add_metric([limit], counts[limit])
        unmapped_family = GaugeMetricFamily(
            "trainmon_pod_resources_unmapped_devices",
            "GPU devices allocated to containers that could not be mapped to a GPU of this "
            "node (a DRA device named neither by UUID nor gpu-<index>: docs/deploy.md).",
            value=unmapped,
        )
        allocatable = GaugeMetricFamily(
            "trainmon_pod_resources_allocatable_devices",
            "GPU devices the kubelet can allocate, by device-plugin resource name.",
            labels=["resource"],
        )
        for resource, count in sorted(allocatable_gpus(resources.allocatable).items()):
            allocatable.add_metric([resource], count)
        return [info, requests, dropped, unmapped_family, allocatable]

    def _pod_info(self, holders: set[tuple[str, str]]) -> Metric:
        """``trainmon_pod_info`` of the pods in ``holders`` the kubelet's pod list names."""
        assert self._pods is not None
        names = self._config.pod_labels
        info = GaugeMetricFamily(
            "trainmon_pod_info",
            "A pod that holds or was allocated a GPU, with the pod labels of "
            "collectors.attribution.pod_labels as label_<name>; always 1.",
            labels=["namespace", "pod", *(label_name(name) for name in names)],
        )
        for namespace, pod in sorted(holders):
            found = self._pods.lookup_name(namespace, pod)
            if found is not None:
                info.add_metric([namespace, pod, *(found.labels.get(n, "") for n in names)],
                                1.0)
        return info

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
