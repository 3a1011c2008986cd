"""What a window says about the node's platform: instance, spot, checkpoints, NUMA, NFS, RDMA.

The platform signals of docs/metrics.md, read from samples like everything in
``measure`` (never from a collector's internals), for the risk findings of
``risks`` and the report's platform, storage and NUMA lines:

- the instance: ``trainmon_node_info{provider,instance_id,instance_type,region,
  zone,...}`` (configured extra labels such as ``leaf`` and ``rack`` kept
  apart), ``trainmon_node_spot_instance``,
  ``trainmon_node_spot_termination_timestamp_seconds`` (present only while a
  reclaim is scheduled) and ``trainmon_platform_metadata_up`` — all latest;
- checkpoints, per job: the latest ``trainmon_training_last_checkpoint_timestamp_seconds``,
  ``trainmon_training_last_checkpoint_duration_seconds``,
  ``trainmon_training_checkpoints_total`` (the largest of its ranks) and
  ``trainmon_training_checkpoint_storage_info{mountpoint,fstype,storage}``; how
  long the job has trained is the largest latest
  ``trainmon_training_step_seconds_sum`` of its ranks (the loop's wall time,
  kept across reporter restarts);
- NUMA: ``trainmon_gpu_numa_node{gpu}`` (latest; -1 where the platform reports
  none) and the mean ``trainmon_gpu_process_numa_local_ratio{gpu,pid}`` (absent
  where the topology is unknown);
- NFS/CFS mounts: ``trainmon_nfs_mount_info`` and the rates of
  ``trainmon_nfs_{read,write}_bytes_total`` and of ``READ`` in
  ``trainmon_nfs_operations_total`` and ``trainmon_nfs_operation_rtt_seconds_total``
  (mean round trip per READ = Δrtt / Δops);
- RDMA ports: ``trainmon_infiniband_port_up`` (latest); the multi-node test of
  the NCCL transport check: ``trainmon_training_world_size{job}``.

A value a source does not provide is ``None``, never zero: a node without the
platform collector has an unknown provider and unknown spot state, and no
finding rests on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainmon.diagnosis.samples import Labels, Window

#: Every sample name ``measure_platform`` reads.
PLATFORM_SAMPLES = frozenset({
    "trainmon_node_info", "trainmon_node_spot_instance",
    "trainmon_node_spot_termination_timestamp_seconds", "trainmon_platform_metadata_up",
    "trainmon_training_last_checkpoint_timestamp_seconds",
    "trainmon_training_last_checkpoint_duration_seconds",
    "trainmon_training_checkpoints_total", "trainmon_training_checkpoint_seconds_total",
    "trainmon_training_checkpoint_storage_info", "trainmon_training_step_seconds_sum",
    "trainmon_training_world_size",
    "trainmon_gpu_numa_node", "trainmon_gpu_process_numa_local_ratio",
    "trainmon_nfs_mount_info", "trainmon_nfs_read_bytes_total",
    "trainmon_nfs_write_bytes_total", "trainmon_nfs_operations_total",
    "trainmon_nfs_operation_rtt_seconds_total",
    "trainmon_infiniband_port_up",
})

#: The identity labels of ``trainmon_node_info``; any other label is a configured
#: extra (``leaf``, ``rack``...).
IDENTITY_LABELS = ("provider", "instance_id", "instance_type", "region", "zone")
#: Checkpoint storage kinds (``trainmon_training_checkpoint_storage_info{storage}``)
#: that are lost with a cloud instance.
INSTANCE_BOUND_STORAGE = ("local_disk", "ephemeral")


@dataclass(frozen=True)
class NodePlatform:
    """The instance the node runs on; empty strings and None where unknown."""

    #: ``tencent`` or ``self-hosted``; empty without ``trainmon_node_info``.
    provider: str = ""
    instance_id: str = ""
    instance_type: str = ""
    region: str = ""
    zone: str = ""
    #: The configured extra labels of ``trainmon_node_info`` (``leaf``, ``rack``...).
    labels: tuple[tuple[str, str], ...] = ()
    #: True on a spot instance, False on a regular one, None when unknown.
    spot: bool | None = None
    #: Whether the metadata service's last poll was valid; None without the metric.
    metadata_up: bool | None = None
    #: Unix time at which the instance is reclaimed, while one is scheduled.
    termination_timestamp: float | None = None

    @property
    def cloud(self) -> bool:
        """A cloud instance (its local disks go with it), as opposed to self-hosted."""
        return self.provider not in ("", "self-hosted")


@dataclass(frozen=True)
class CheckpointStorage:
    mountpoint: str
    fstype: str
    #: ``local_disk``, ``cloud_disk``, ``network_fs``, ``object_store``,
    #: ``ephemeral`` or ``unknown``.
    storage: str


@dataclass(frozen=True)
class CheckpointState:
    job: str
    #: Unix time of the job's newest completed checkpoint (any rank); None if none reported.
    last_timestamp: float | None
    last_duration_seconds: float | None
    #: Completed checkpoints of the job: the largest count of its ranks (in DDP every
    #: rank may count the same save); None if none reports the count.
    checkpoints: float | None
    storage: tuple[CheckpointStorage, ...]
    #: Seconds the job's longest-running rank has spent in its training loop.
    run_seconds: float | None


@dataclass(frozen=True)
class NumaProcess:
    """A GPU process's share of allowed CPUs on its GPU's NUMA node (mean, 0-1)."""

    gpu: str
    pid: str
    local_ratio: float


@dataclass(frozen=True)
class NfsMount:
    mountpoint: str
    server: str
    export: str
    fstype: str
    version: str
    read_bytes_per_second: float | None
    write_bytes_per_second: float | None
    read_operations_per_second: float | None
    #: Mean round trip per READ over the window (seconds); None without READs.
    read_rtt_seconds: float | None

    @property
    def source(self) -> str:
        """``server:export`` as mount(8) shows it."""
        return f"{self.server}:{self.export}" if self.server else self.export


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: str
    up: bool


@dataclass(frozen=True)
class PlatformMeasurements:
    node: NodePlatform = NodePlatform()
    checkpoints: tuple[CheckpointState, ...] = ()
    #: ``(gpu, NUMA node)`` from ``trainmon_gpu_numa_node``; -1 where unknown.
    gpu_numa_nodes: tuple[tuple[str, int], ...] = ()
    numa_processes: tuple[NumaProcess, ...] = ()
    nfs_mounts: tuple[NfsMount, ...] = ()
    rdma_ports: tuple[RdmaPort, ...] = ()
    #: ``(job, world size)`` as the job's processes report it.
    world_sizes: tuple[tuple[str, float], ...] = ()

    def numa_node(self, gpu: str) -> int | None:
        return dict(self.gpu_numa_nodes).get(gpu)


def measure_platform(window: Window) -> PlatformMeasurements:
    """The platform signals of one window."""
    return PlatformMeasurements(
        node=_node(window),
        checkpoints=_checkpoints(window),
        gpu_numa_nodes=tuple(sorted(
            (labels["gpu"], int(value))
            for labels, value in _latest(window, "trainmon_gpu_numa_node") if "gpu" in labels
        )),
        numa_processes=tuple(
            NumaProcess(labels["gpu"], labels["pid"], value)
            for labels, value in _means(window, "trainmon_gpu_process_numa_local_ratio")
            if "gpu" in labels and "pid" in labels
        ),
        nfs_mounts=_nfs_mounts(window),
        rdma_ports=tuple(
            RdmaPort(labels.get("device", ""), labels.get("port", ""), value == 1)
            for labels, value in _latest(window, "trainmon_infiniband_port_up")
        ),
        world_sizes=tuple(sorted(
            (labels["job"], value)
            for labels, value in _latest(window, "trainmon_training_world_size") if "job" in labels
        )),
    )


def _latest(window: Window, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(labels), value) for labels, value in window.latest(name).items()]


def _means(window: Window, name: str) -> list[tuple[dict[str, str], float]]:
    means = []
    for labels in window.label_sets(name):
        value = window.mean(name, labels)
        if value is not None:
            means.append((dict(labels), value))
    return means


def _node(window: Window) -> NodePlatform:
    info = window.latest("trainmon_node_info")
    labels: dict[str, str] = dict(next(iter(info))) if info else {}
    spot = _single(window.latest("trainmon_node_spot_instance"))
    metadata = _single(window.latest("trainmon_platform_metadata_up"))
    return NodePlatform(
        provider=labels.get("provider", ""),
        instance_id=labels.get("instance_id", ""),
        instance_type=labels.get("instance_type", ""),
        region=labels.get("region", ""),
        zone=labels.get("zone", ""),
        labels=tuple(sorted((k, v) for k, v in labels.items() if k not in IDENTITY_LABELS)),
        spot=None if spot is None else spot == 1,
        metadata_up=None if metadata is None else metadata == 1,
        termination_timestamp=_single(
            window.latest("trainmon_node_spot_termination_timestamp_seconds")),
    )


def _single(series: Mapping[Labels, float]) -> float | None:
    """The value of a node-level gauge (one series); the largest if several."""
    return max(series.values(), default=None)


def _checkpoints(window: Window) -> tuple[CheckpointState, ...]:
    by_job: dict[str, dict[str, list[float]]] = {}

    def add(name: str, key: str) -> None:
        for labels, value in _latest(window, name):
            if "job" in labels:
                by_job.setdefault(labels["job"], {}).setdefault(key, []).append(value)

    add("trainmon_training_last_checkpoint_timestamp_seconds", "last")
    add("trainmon_training_last_checkpoint_duration_seconds", "duration")
    add("trainmon_training_checkpoints_total", "count")
    add("trainmon_training_step_seconds_sum", "run")
    storage: dict[str, list[CheckpointStorage]] = {}
    for labels, _ in _latest(window, "trainmon_training_checkpoint_storage_info"):
        if "job" in labels:
            storage.setdefault(labels["job"], []).append(CheckpointStorage(
                labels.get("mountpoint", ""), labels.get("fstype", ""),
                labels.get("storage", "unknown")))
            by_job.setdefault(labels["job"], {})
    return tuple(
        CheckpointState(
            job=job,
            last_timestamp=max(values["last"]) if "last" in values else None,
            last_duration_seconds=max(values["duration"]) if "duration" in values else None,
            checkpoints=max(values["count"]) if "count" in values else None,
            storage=tuple(sorted(storage.get(job, []), key=lambda s: s.mountpoint)),
            run_seconds=max(values["run"]) if "run" in values else None,
        )
        for job, values in sorted(by_job.items())
    )


def _nfs_mounts(window: Window) -> tuple[NfsMount, ...]:
    info = {labels.get("mountpoint", ""): labels
            for labels, _ in _latest(window, "trainmon_nfs_mount_info")}
    for label_set in window.label_sets("trainmon_nfs_read_bytes_total"):
        info.setdefault(dict(label_set).get("mountpoint", ""), dict(label_set))
    mounts = []
    for mountpoint, labels in sorted(info.items()):
        if not mountpoint:
            continue
        read_ops = _rate(window, "trainmon_nfs_operations_total", mountpoint, "READ")
        ops = _increase(window, "trainmon_nfs_operations_total", mountpoint, "READ")
        rtt = _increase(window, "trainmon_nfs_operation_rtt_seconds_total", mountpoint, "READ")
        mounts.append(NfsMount(
            mountpoint=mountpoint,
            server=labels.get("server", ""),
            export=labels.get("export", ""),
            fstype=labels.get("fstype", ""),
            version=labels.get("version", ""),
            read_bytes_per_second=_rate(window, "trainmon_nfs_read_bytes_total", mountpoint),
            write_bytes_per_second=_rate(window, "trainmon_nfs_write_bytes_total", mountpoint),
            read_operations_per_second=read_ops,
            read_rtt_seconds=rtt / ops if ops and rtt is not None else None,
        ))
    return tuple(mounts)


def _series(window: Window, name: str, mountpoint: str, operation: str | None) -> Labels | None:
    """The label set of ``name`` for a mount point (and operation), whatever else it carries."""
    for labels in window.label_sets(name):
        labels_dict = dict(labels)
        if labels_dict.get("mountpoint") == mountpoint and (
                operation is None or labels_dict.get("operation") == operation):
            return labels
    return None


def _rate(window: Window, name: str, mountpoint: str, operation: str | None = None
          ) -> float | None:
    labels = _series(window, name, mountpoint, operation)
    return None if labels is None else window.rate(name, labels)


def _increase(window: Window, name: str, mountpoint: str, operation: str | None = None
              ) -> float | None:
    labels = _series(window, name, mountpoint, operation)
    return None if labels is None else window.increase(name, labels)
