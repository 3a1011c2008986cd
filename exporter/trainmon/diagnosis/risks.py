"""Risk findings: what the platform says beside the verdict (spot, checkpoints, NUMA, NCCL).

The verdict (``rules``) says what holds a job back now; these findings say
what can cost it its work or its speed, from the platform signals measured by
``trainmon.diagnosis.platform_signals``. They never decide the verdict: each
job keeps its kind, and these follow its findings with a ``severity``
(``critical`` or ``warning``) and their own next step (the report's words,
``trainmon.report.messages.ADVICE``). The thresholds are
``collectors.diagnosis`` keys whose defaults live in ``trainmon.contract``,
where the alert rules read them too:

- ``spot_reclaim`` (scheduling, critical): ``trainmon_node_spot_termination_timestamp_seconds``
  is present — the spot instance is reclaimed at that time; every job on the
  node gets it, naming the seconds left and the jobs (tuning article §4.1: a spot
  instance may be reclaimed, so checkpoint and resume elsewhere);
- ``checkpoint_overdue`` (storage): on a spot instance the job's last
  checkpoint is older than ``checkpoint_max_age_seconds`` — warning, critical
  while a reclaim is scheduled; ``checkpoint_missing``: the job reported no
  checkpoint at all although its ranks have trained longer than that (a job
  that does not report checkpoints, ``reporter.checkpoint(path)``, reads the
  same: the text says "reported");
- ``checkpoint_local_disk`` (storage, warning): on a cloud instance
  (``provider`` not ``self-hosted``) the job's checkpoints land on storage lost
  with the instance, ``local_disk`` or ``ephemeral`` (tuning article §6.2:
  checkpoint 一定不要只写在本地临时盘);
- ``numa_far`` (scheduling, warning): a process of the job has less than
  ``numa_local_ratio_min`` of its allowed CPUs on its GPU's NUMA node. Only
  where the topology is known: a GPU whose ``numa_node`` is -1 (virtualised
  hosts) or a process without a ratio never gives a mismatch (tuning article §4.3);
- ``mixed_gpus`` (scheduling, warning): the job's GPUs on the node span GPU models
  (``trainmon_gpu_info{name}``) or clock classes (maximum SM clocks more than
  ``CLOCK_CLASS_SPREAD`` apart): the slowest sets the pace of every synchronous step
  (tuning article: 分区内不要混用不同代际GPU; across nodes, the rule
  ``job:trainmon_gpu_models:count``);
- ``nccl_over_sockets`` (communication, warning): a multi-node job (its world
  size above its ranks on this node) waits at least
  ``nccl_socket_min_comm_ratio`` of each step for communication while every
  ACTIVE RDMA port moves less than ``rdma_idle_bytes_per_second`` and an
  Ethernet NIC at least ``socket_busy_bytes_per_second`` (receive + transmit):
  NCCL fell back to TCP sockets (tuning article §2.2: the NCCL log shows IB or Socket).

Beside them the storage findings name the dataset's network filesystem: when
``data_wait`` or ``sawtooth_data_wait`` fires and an NFS/CFS mount reads, the
busiest one (by read bytes per second) is added to the first one's values
(``with_storage_source``), and the advice turns to warming the dataset onto
local NVMe (tuning article §3.2).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import replace

from trainmon.diagnosis.finding import Finding
from trainmon.diagnosis.measure import GPUState, LinkState, NodeMeasurements
from trainmon.diagnosis.platform_signals import INSTANCE_BOUND_STORAGE, NfsMount
from trainmon.diagnosis.thresholds import DiagnosisConfig

#: Storage findings whose values name the NFS/CFS mount the data comes from.
STORAGE_CODES = ("data_wait", "sawtooth_data_wait")


def utc_text(timestamp: float) -> str:
    """``2026-12-01 12:00:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def reclaim_finding(node: NodeMeasurements, jobs: Sequence[str]) -> Finding | None:
    """``spot_reclaim`` while a reclaim is scheduled; ``jobs`` are those on the node."""
    at = node.platform.node.termination_timestamp
    if at is None:
        return None
    return Finding("scheduling", "spot_reclaim", {
        "timestamp": at, "at": utc_text(at), "seconds": max(0.0, at - node.wall_time),
        "jobs": ", ".join(jobs) or "-"}, severity="critical")


def checkpoint_findings(job: str, node: NodeMeasurements, config: DiagnosisConfig
                        ) -> list[Finding]:
    """Checkpoint age on a spot instance, and checkpoints on instance-bound storage."""
    platform = node.platform
    state = next((c for c in platform.checkpoints if c.job == job), None)
    if state is None:
        return []
    findings = []
    reclaim = platform.node.termination_timestamp
    severity = "critical" if reclaim is not None else "warning"
    values: dict[str, float | str] = {"threshold": config.checkpoint_max_age_seconds}
    if reclaim is not None:
        values["reclaim_seconds"] = max(0.0, reclaim - node.wall_time)
    if platform.node.spot:
        if state.last_timestamp is not None:
            age = max(0.0, node.wall_time - state.last_timestamp)
            if age > config.checkpoint_max_age_seconds:
                findings.append(Finding("storage", "checkpoint_overdue", {
                    **values, "age": age, "at": utc_text(state.last_timestamp)},
                    severity=severity))
        elif (state.run_seconds is not None
              and state.run_seconds > config.checkpoint_max_age_seconds):
            findings.append(Finding("storage", "checkpoint_missing", {
                **values, "run": state.run_seconds}, severity=severity))
    if platform.node.cloud:
        lost = [s for s in state.storage if s.storage in INSTANCE_BOUND_STORAGE]
        if lost:
            findings.append(Finding("storage", "checkpoint_local_disk", {
                "mountpoint": lost[0].mountpoint, "fstype": lost[0].fstype,
                "storage": lost[0].storage, "provider": platform.node.provider},
                severity="warning"))
    return findings


#: GPUs whose maximum SM clocks differ by more than this share are of different clock
#: classes (an H100 SXM at 1.98 GHz beside an H100 PCIe at 1.755 GHz: 11 %).
CLOCK_CLASS_SPREAD = 0.05


def mixed_gpus_finding(gpus: Sequence[GPUState]) -> Finding | None:
    """``mixed_gpus`` (scheduling, warning) when the job's GPUs on the node span GPU models
    or clock classes: the slowest sets the pace of every synchronous step (tuning
    article: 分区内不要混用不同代际GPU，否则慢节点拖累整个并行任务)."""
    models = sorted({gpu.model for gpu in gpus if gpu.model})
    clocks = [gpu.max_clock_hertz for gpu in gpus if gpu.max_clock_hertz]
    spread = (max(clocks) - min(clocks)) / max(clocks) if clocks else 0.0
    if len(models) < 2 and spread <= CLOCK_CLASS_SPREAD:
        return None
    return Finding("scheduling", "mixed_gpus", {
        "models": ", ".join(models) or "?",
        "gpus": ",".join(gpu.gpu for gpu in gpus),
        "clock_spread": spread,
        "slowest_mhz": min(clocks) / 1e6 if clocks else 0.0,
        "fastest_mhz": max(clocks) / 1e6 if clocks else 0.0}, severity="warning")


def numa_findings(processes: Collection[tuple[str, str]], node: NodeMeasurements,
                  config: DiagnosisConfig) -> list[Finding]:
    """``numa_far`` for the job's ``(gpu, pid)`` processes whose CPUs are mostly remote."""
    platform = node.platform
    far = []
    for process in platform.numa_processes:
        numa_node = platform.numa_node(process.gpu)
        if ((process.gpu, process.pid) in processes and numa_node is not None
                and numa_node >= 0 and process.local_ratio < config.numa_local_ratio_min):
            far.append((process, numa_node))
    if not far:
        return []
    far.sort(key=lambda item: item[0].local_ratio)
    return [Finding("scheduling", "numa_far", {
        # no words, so the same text stands in the en and zh messages
        "processes": ", ".join(
            f"{p.pid} (GPU {p.gpu}, NUMA {n}, {p.local_ratio:.0%})" for p, n in far),
        "pids": ",".join(p.pid for p, _ in far),
        "gpu": far[0][0].gpu,
        "node": float(far[0][1]),
        "ratio": far[0][0].local_ratio,
        "threshold": config.numa_local_ratio_min}, severity="warning")]


def nccl_socket_finding(
    job: str, ranks_here: int, comm_ratio: float | None, node: NodeMeasurements,
    config: DiagnosisConfig,
) -> Finding | None:
    """``nccl_over_sockets`` when a communicating multi-node job leaves RDMA idle."""
    world = dict(node.platform.world_sizes).get(job)
    if (comm_ratio is None or comm_ratio < config.nccl_socket_min_comm_ratio
            or world is None or world <= ranks_here):
        return None
    active = [(p.device, p.port) for p in node.platform.rdma_ports if p.up]
    if not active:
        return None
    ports = {(link.device, link.port): _bytes_per_second(link)
             for link in node.links if link.kind == "infiniband"}
    rdma_rates = [ports.get(port) for port in active]
    if any(rate is None for rate in rdma_rates):
        return None  # a port whose counters are not measured could be carrying it
    rdma_rate = max(rate for rate in rdma_rates if rate is not None)
    nics = [(rate, link.device) for link in node.links
            if link.kind == "nic" and (rate := _bytes_per_second(link)) is not None]
    if rdma_rate >= config.rdma_idle_bytes_per_second or not nics:
        return None
    nic_rate, nic = max(nics)
    if nic_rate < config.socket_busy_bytes_per_second:
        return None
    return Finding("communication", "nccl_over_sockets", {
        "ratio": comm_ratio, "threshold": config.nccl_socket_min_comm_ratio,
        "rdma": ",".join(f"{device}:{port}" for device, port in active),
        "hcas": ",".join(dict.fromkeys(device for device, _ in active)),
        "rdma_bytes_per_second": rdma_rate, "nic": nic, "nic_bytes_per_second": nic_rate,
        "world_size": world, "ranks": float(ranks_here)}, severity="warning")


def _bytes_per_second(link: LinkState) -> float | None:
    """Receive + transmit bytes per second; None when neither is measured."""
    rates = [r for r in (link.receive_bytes_per_second, link.transmit_bytes_per_second)
             if r is not None]
    return sum(rates) if rates else None


def busiest_nfs_mount(node: NodeMeasurements) -> NfsMount | None:
    """The NFS/CFS mount that reads the most bytes per second; None if none reads."""
    reading = [m for m in node.platform.nfs_mounts if m.read_bytes_per_second]
    return max(reading, key=lambda m: m.read_bytes_per_second or 0.0, default=None)


def with_storage_source(findings: Sequence[Finding], mount: NfsMount | None) -> list[Finding]:
    """The first storage finding with the NFS/CFS mount the data comes from in its values."""
    if mount is None:
        return list(findings)
    source: dict[str, float | str] = {
        "mount": mount.mountpoint, "source": mount.source, "fstype": mount.fstype,
        "read_bytes_per_second": mount.read_bytes_per_second or 0.0}
    if mount.read_rtt_seconds is not None:
        source["read_rtt_milliseconds"] = mount.read_rtt_seconds * 1000
    first = next((i for i, f in enumerate(findings) if f.code in STORAGE_CODES), None)
    return [replace(f, values={**f.values, **source}) if i == first else f
            for i, f in enumerate(findings)]
