"""The diagnosis as a report: the JSON-ready document of ``trainmon doctor``.

``build_report`` turns a window into the ``--json`` document: the platform,
GPUs and NUMA binding, storage (disks, NFS/CFS mounts, checkpoints), network,
then each job's verdict, its findings (risk findings with their severity), its
evidence and the next action, in English or Chinese (``text``);
``render.render_text`` prints it for a human. The JSON keys are stable; the
messages follow ``lang``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from trainmon.diagnosis.config import DiagnosisConfig
from trainmon.diagnosis.finding import SEVERITIES, Finding
from trainmon.diagnosis.measure import (
    DiskState,
    GPUProcessState,
    LinkState,
    NcclState,
    NodeMeasurements,
    measure,
)
from trainmon.diagnosis.platform import NfsMount, PlatformMeasurements
from trainmon.diagnosis.rules import (
    ACTIONABLE_KINDS,
    Evidence,
    Verdict,
    diagnose,
    node_findings,
    numa_jobs,
    process_jobs,
)
from trainmon.diagnosis.samples import Window
from trainmon.diagnosis.text import (
    EXTRA_ADVICE,
    advice_text,
    finding_text,
    kind_name,
    nccl_text,
)

#: ``status`` → ``doctor`` exit code: ``risk`` is no bottleneck but a critical or
#: warning finding (a spot reclaim, an overdue checkpoint...), which needs action too.
EXIT_CODES = {"healthy": 0, "bottleneck": 1, "risk": 1, "unmeasured": 2}


# -- the JSON document ------------------------------------------------------------


class _SourceKind(TypedDict):
    kind: str  # "url" or "local"


class Source(_SourceKind, total=False):
    """What was measured: ``url`` for a daemon; ``seconds`` and ``snapshots`` once measured."""

    url: str
    seconds: float
    snapshots: int


class ProcessEntry(TypedDict):
    """A process on a GPU and who runs it (``measure.GPUProcessState``), with its job."""

    gpu: str
    pid: str
    pod: str
    namespace: str
    container: str
    slurm_job: str
    pod_uid: str
    job: str


class GPUEntry(TypedDict):
    gpu: str
    utilization_ratio: float | None
    sawtooth_ratio: float | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    #: GPM activity means (0-1); None on GPUs without GPM (before Hopper).
    sm_active_ratio: float | None
    sm_occupancy_ratio: float | None
    tensor_active_ratio: float | None
    dram_active_ratio: float | None
    #: ``trainmon_gpu_pipe_active_ratio`` means by pipe; empty without GPM.
    pipe_active_ratio: dict[str, float]
    #: The job and rank that report this GPU; empty strings when none does.
    job: str
    rank: str
    processes: list[ProcessEntry]


class StorageJobEntry(TypedDict):
    job: str
    data_wait_ratio: float
    #: The rank that waits longest for data.
    rank: str


class DiskEntry(TypedDict):
    device: str
    busy_ratio: float | None
    read_bytes_per_second: float | None
    write_bytes_per_second: float | None


class CheckpointEntry(TypedDict):
    """A job's checkpoints (``platform.CheckpointState``); None where not reported."""

    job: str
    last_timestamp: float | None
    #: Seconds since the last checkpoint, at the end of the window.
    age_seconds: float | None
    last_duration_seconds: float | None
    checkpoints: float | None
    #: The mount of the newest checkpoint and its kind (``local_disk``, ``cloud_disk``,
    #: ``network_fs``, ``object_store``, ``ephemeral``, ``unknown``); empty when unknown.
    mountpoint: str
    fstype: str
    storage: str


class NfsEntry(TypedDict):
    """An NFS/CFS mount (``trainmon_nfs_*``) over the window."""

    mountpoint: str
    server: str
    export: str
    fstype: str
    version: str
    read_bytes_per_second: float | None
    write_bytes_per_second: float | None
    read_operations_per_second: float | None
    #: Mean round trip per READ, seconds.
    read_rtt_seconds: float | None


class StorageSection(TypedDict):
    jobs: list[StorageJobEntry]
    disks: list[DiskEntry]
    checkpoints: list[CheckpointEntry]
    nfs: list[NfsEntry]


class NetworkJobEntry(TypedDict):
    job: str
    #: Communication waited for / step time of the rank that waits least.
    comm_ratio: float
    #: ``measured`` (exposed communication measured inside the job), ``phase``
    #: (the comm phase) or ``mixed``: what ``comm_ratio`` rests on.
    comm_source: str
    #: Communication overlapped with compute / step time; None when not measured.
    comm_overlapped_ratio: float | None
    #: Collective bytes / seconds in flight; None when not measured.
    comm_bytes_per_second: float | None


class LinkEntry(TypedDict):
    kind: str  # "nic" or "infiniband"
    device: str
    #: Empty for a NIC.
    port: str
    receive_bytes_per_second: float | None
    transmit_bytes_per_second: float | None
    rate_bytes_per_second: float | None
    #: The busier direction over the link rate.
    utilization_ratio: float | None
    #: InfiniBand/RoCE: whether the port is ACTIVE (``trainmon_infiniband_port_up``);
    #: None for a NIC or where not exported.
    port_up: bool | None


class NcclEntry(TypedDict):
    pid: str
    problem: str
    variable: str
    value: str
    message: str


class NetworkSection(TypedDict):
    jobs: list[NetworkJobEntry]
    links: list[LinkEntry]
    nccl: list[NcclEntry]


class FindingEntry(TypedDict):
    kind: str
    code: str
    #: ``critical`` or ``warning`` for the risk findings; empty for the verdict's.
    severity: str
    values: dict[str, float | str]
    message: str


class PlatformSection(TypedDict):
    """The instance (``trainmon_node_info``...); empty strings and None where unknown."""

    provider: str
    instance_id: str
    instance_type: str
    region: str
    zone: str
    #: Configured extra labels of ``trainmon_node_info`` (``leaf``, ``rack``...).
    labels: dict[str, str]
    spot: bool | None
    metadata_up: bool | None
    #: Unix time of a scheduled spot reclaim, and the seconds left; None if none.
    termination_timestamp: float | None
    termination_seconds: float | None
    #: Findings about the node itself (``spot_reclaim``).
    findings: list[FindingEntry]


class NumaGPUEntry(TypedDict):
    gpu: str
    #: ``trainmon_gpu_numa_node``: -1 where the platform reports none (virtualised hosts).
    numa_node: int


class NumaProcessEntry(TypedDict):
    gpu: str
    pid: str
    job: str
    numa_node: int | None
    #: Share of the process's allowed CPUs on the GPU's NUMA node (0-1).
    local_ratio: float
    #: ``local`` or ``far`` (below ``numa_local_ratio_min``).
    status: str


class NumaSection(TypedDict):
    gpus: list[NumaGPUEntry]
    processes: list[NumaProcessEntry]


class EvidenceEntry(TypedDict):
    """``rules.Evidence``, field for field."""

    ranks: int
    steps: float
    step_seconds: float | None
    data_wait_ratio: float | None
    worst_data_wait_rank: str
    comm_ratio: float | None
    comm_source: str
    comm_overlapped_ratio: float | None
    comm_bytes_per_second: float | None
    straggler_ratio: float | None
    straggler_rank: str
    gpu_utilization_ratio: float | None
    gpus: list[str]
    idle_gpus: list[str]
    sawtooth_ratio: float | None
    stalled_ranks: list[str]
    seconds_since_last_step: float | None
    busiest_link: str
    busiest_link_utilization: float | None
    sm_active_ratio: float | None
    sm_occupancy_ratio: float | None
    tensor_active_ratio: float | None
    dram_active_ratio: float | None
    pipe_active_ratio: dict[str, float]
    gpm_gpus: list[str]
    memory_used_ratio: float | None
    memory_full_gpus: list[str]
    storage_mountpoint: str
    storage_source: str
    storage_read_bytes_per_second: float | None
    storage_read_rtt_seconds: float | None


class JobEntry(TypedDict):
    job: str
    kind: str
    kind_name: str
    #: The deciding finding first.
    findings: list[FindingEntry]
    evidence: EvidenceEntry
    advice: str
    nccl: list[NcclEntry]


class Report(TypedDict):
    """The ``doctor --json`` document; its keys are stable."""

    source: Source
    lang: str
    platform: PlatformSection
    gpus: list[GPUEntry]
    numa: NumaSection
    storage: StorageSection
    network: NetworkSection
    jobs: list[JobEntry]
    status: str  # "healthy", "bottleneck", "risk" or "unmeasured"
    #: Why nothing could be measured; empty otherwise.
    reason: str
    exit_code: int


def build_report(
    window: Window, config: DiagnosisConfig, source: Source, lang: str = "en"
) -> Report:
    """The whole report as JSON-ready data."""
    node = measure(window, config.comm_phases)
    verdicts = diagnose(node, config)
    on_node = node_findings(node, verdicts)
    status, reason = _status(node, verdicts, on_node)
    return {
        "source": {**source, "seconds": round(window.seconds, 3),
                   "snapshots": len(window.snapshots)},
        "lang": lang,
        "platform": _platform_section(node, on_node, lang),
        "gpus": _gpu_section(node),
        "numa": _numa_section(node, config),
        "storage": {
            "jobs": [{"job": v.job, "data_wait_ratio": v.evidence.data_wait_ratio,
                      "rank": v.evidence.worst_data_wait_rank}
                     for v in verdicts if v.evidence.data_wait_ratio is not None],
            "disks": [_disk_entry(disk) for disk in node.disks],
            "checkpoints": _checkpoint_entries(node.platform, node.wall_time),
            "nfs": [_nfs_entry(mount) for mount in node.platform.nfs_mounts],
        },
        "network": {
            "jobs": [{"job": v.job, "comm_ratio": v.evidence.comm_ratio,
                      "comm_source": v.evidence.comm_source,
                      "comm_overlapped_ratio": v.evidence.comm_overlapped_ratio,
                      "comm_bytes_per_second": v.evidence.comm_bytes_per_second}
                     for v in verdicts if v.evidence.comm_ratio is not None],
            "links": [_link_entry(link, node.platform) for link in node.links],
            "nccl": [_nccl_entry(problem, lang) for problem in node.nccl],
        },
        "jobs": [_job_entry(verdict, lang) for verdict in verdicts],
        "status": status,
        "reason": reason,
        "exit_code": EXIT_CODES[status],
    }


def unmeasured_report(source: Source, reason: str, lang: str = "en") -> Report:
    """The report when the source could not be read at all."""
    return {
        "source": source, "lang": lang, "platform": _platform_section(None, [], lang),
        "gpus": [], "numa": {"gpus": [], "processes": []},
        "storage": {"jobs": [], "disks": [], "checkpoints": [], "nfs": []},
        "network": {"jobs": [], "links": [], "nccl": []},
        "jobs": [], "status": "unmeasured", "reason": reason,
        "exit_code": EXIT_CODES["unmeasured"],
    }


def _status(node: NodeMeasurements, verdicts: Sequence[Verdict],
            on_node: Sequence[Finding]) -> tuple[str, str]:
    """``bottleneck`` if any verdict needs action; ``risk`` if none does but a critical
    or warning finding stands; ``healthy`` if something was measured and nothing needs
    action; else ``unmeasured`` with the reason."""
    if any(verdict.kind in ACTIONABLE_KINDS for verdict in verdicts):
        return "bottleneck", ""
    findings = [*on_node, *(f for verdict in verdicts for f in verdict.findings)]
    if any(finding.severity in SEVERITIES for finding in findings):
        return "risk", ""
    reporting = [verdict for verdict in verdicts if verdict.evidence.ranks]
    if any(verdict.kind == "compute" for verdict in verdicts):
        return "healthy", ""
    if reporting:
        return "unmeasured", "the jobs made too few steps in the window; sample longer"
    if node.gpus:
        return "healthy", ""
    return "unmeasured", "no GPU and no training job seen (is NVML present? do jobs report?)"


def _gpu_section(node: NodeMeasurements) -> list[GPUEntry]:
    rank_of_gpu = {rank.gpu: rank for rank in node.ranks if rank.gpu}
    jobs = process_jobs(node)
    section: list[GPUEntry] = []
    for gpu in node.gpus:
        rank = rank_of_gpu.get(gpu.gpu)
        section.append({
            "gpu": gpu.gpu,
            "utilization_ratio": gpu.utilization,
            "sawtooth_ratio": gpu.sawtooth,
            "memory_used_bytes": gpu.memory_used_bytes,
            "memory_total_bytes": gpu.memory_total_bytes,
            "sm_active_ratio": gpu.sm_active,
            "sm_occupancy_ratio": gpu.sm_occupancy,
            "tensor_active_ratio": gpu.tensor_active,
            "dram_active_ratio": gpu.dram_active,
            "pipe_active_ratio": dict(gpu.pipes),
            "job": rank.job if rank else "",
            "rank": rank.rank if rank else "",
            "processes": [
                _process_entry(process, jobs[process])
                for process in node.processes if process.gpu == gpu.gpu
            ],
        })
    return section


def _process_entry(process: GPUProcessState, job: str) -> ProcessEntry:
    return {
        "gpu": process.gpu, "pid": process.pid, "pod": process.pod,
        "namespace": process.namespace, "container": process.container,
        "slurm_job": process.slurm_job, "pod_uid": process.pod_uid, "job": job,
    }


def _disk_entry(disk: DiskState) -> DiskEntry:
    return {
        "device": disk.device,
        "busy_ratio": disk.busy_ratio,
        "read_bytes_per_second": disk.read_bytes_per_second,
        "write_bytes_per_second": disk.write_bytes_per_second,
    }


def _link_entry(link: LinkState, platform: PlatformMeasurements) -> LinkEntry:
    ports = {(port.device, port.port): port.up for port in platform.rdma_ports}
    return {
        "kind": link.kind,
        "device": link.device,
        "port": link.port,
        "receive_bytes_per_second": link.receive_bytes_per_second,
        "transmit_bytes_per_second": link.transmit_bytes_per_second,
        "rate_bytes_per_second": link.rate_bytes_per_second,
        "utilization_ratio": link.utilization,
        "port_up": ports.get((link.device, link.port)) if link.kind == "infiniband" else None,
    }


def _platform_section(node: NodeMeasurements | None, on_node: Sequence[Finding],
                      lang: str) -> PlatformSection:
    platform = node.platform.node if node else PlatformMeasurements().node
    at = platform.termination_timestamp
    return {
        "provider": platform.provider,
        "instance_id": platform.instance_id,
        "instance_type": platform.instance_type,
        "region": platform.region,
        "zone": platform.zone,
        "labels": dict(platform.labels),
        "spot": platform.spot,
        "metadata_up": platform.metadata_up,
        "termination_timestamp": at,
        "termination_seconds": max(0.0, at - node.wall_time) if at is not None and node
        else None,
        "findings": [_finding_entry(finding, lang) for finding in on_node],
    }


def _numa_section(node: NodeMeasurements, config: DiagnosisConfig) -> NumaSection:
    jobs = {process: job for job, processes in numa_jobs(node).items()
            for process in processes}
    platform = node.platform
    processes: list[NumaProcessEntry] = []
    for process in platform.numa_processes:
        numa_node = platform.numa_node(process.gpu)
        far = (numa_node is not None and numa_node >= 0
               and process.local_ratio < config.numa_local_ratio_min)
        processes.append({
            "gpu": process.gpu, "pid": process.pid,
            "job": jobs.get((process.gpu, process.pid), ""),
            "numa_node": numa_node, "local_ratio": process.local_ratio,
            "status": "far" if far else "local",
        })
    return {
        "gpus": [{"gpu": gpu, "numa_node": numa_node}
                 for gpu, numa_node in platform.gpu_numa_nodes],
        "processes": processes,
    }


def _checkpoint_entries(platform: PlatformMeasurements, wall_time: float
                        ) -> list[CheckpointEntry]:
    entries: list[CheckpointEntry] = []
    for state in platform.checkpoints:
        if (state.last_timestamp is None and state.checkpoints is None
                and not state.storage):
            continue  # a job that reports no checkpoint fields at all
        storage = state.storage[0] if state.storage else None
        entries.append({
            "job": state.job,
            "last_timestamp": state.last_timestamp,
            "age_seconds": None if state.last_timestamp is None
            else max(0.0, wall_time - state.last_timestamp),
            "last_duration_seconds": state.last_duration_seconds,
            "checkpoints": state.checkpoints,
            "mountpoint": storage.mountpoint if storage else "",
            "fstype": storage.fstype if storage else "",
            "storage": storage.storage if storage else "",
        })
    return entries


def _nfs_entry(mount: NfsMount) -> NfsEntry:
    return {
        "mountpoint": mount.mountpoint, "server": mount.server, "export": mount.export,
        "fstype": mount.fstype, "version": mount.version,
        "read_bytes_per_second": mount.read_bytes_per_second,
        "write_bytes_per_second": mount.write_bytes_per_second,
        "read_operations_per_second": mount.read_operations_per_second,
        "read_rtt_seconds": mount.read_rtt_seconds,
    }


def _finding_entry(finding: Finding, lang: str) -> FindingEntry:
    return {"kind": finding.kind, "code": finding.code, "severity": finding.severity,
            "values": finding.values,
            "message": finding_text(finding.code, finding.values, lang)}


def _job_entry(verdict: Verdict, lang: str) -> JobEntry:
    return {
        "job": verdict.job,
        "kind": verdict.kind,
        "kind_name": kind_name(verdict.kind, lang),
        "findings": [_finding_entry(finding, lang) for finding in verdict.findings],
        "evidence": _evidence_entry(verdict.evidence),
        "advice": _advice(verdict, lang),
        "nccl": [_nccl_entry(problem, lang) for problem in verdict.nccl],
    }


def _advice(verdict: Verdict, lang: str) -> str:
    """The next steps of critical findings (a spot reclaim: checkpoint now), the
    deciding finding's (with the network filesystem's when the data comes from
    one), then those of findings that need one wherever they stand
    (``text.EXTRA_ADVICE``: an out-of-memory risk, the other risk findings)."""
    deciding, *others = verdict.findings
    ordered = [f for f in others if f.severity == "critical"] + [deciding]
    if any(f.code == "spot_reclaim" for f in others):
        # "save a checkpoint now" says what the checkpoint-age steps would
        ordered = [f for f in ordered if f.code not in ("checkpoint_overdue",
                                                        "checkpoint_missing")]
    if deciding.code in ("data_wait", "sawtooth_data_wait") and "mount" in deciding.values:
        ordered.append(Finding(deciding.kind, "nfs_prefetch", deciding.values))
    ordered += [f for f in others if f.code in EXTRA_ADVICE and f.severity != "critical"]
    seen: set[str] = set()
    texts = []
    for finding in ordered:
        if finding.code in seen:
            continue
        seen.add(finding.code)
        if text := advice_text(finding.code, lang, finding.values):
            texts.append(text)
    return " ".join(texts)


def _evidence_entry(evidence: Evidence) -> EvidenceEntry:
    return {
        "ranks": evidence.ranks,
        "steps": evidence.steps,
        "step_seconds": evidence.step_seconds,
        "data_wait_ratio": evidence.data_wait_ratio,
        "worst_data_wait_rank": evidence.worst_data_wait_rank,
        "comm_ratio": evidence.comm_ratio,
        "comm_source": evidence.comm_source,
        "comm_overlapped_ratio": evidence.comm_overlapped_ratio,
        "comm_bytes_per_second": evidence.comm_bytes_per_second,
        "straggler_ratio": evidence.straggler_ratio,
        "straggler_rank": evidence.straggler_rank,
        "gpu_utilization_ratio": evidence.gpu_utilization_ratio,
        "gpus": list(evidence.gpus),
        "idle_gpus": list(evidence.idle_gpus),
        "sawtooth_ratio": evidence.sawtooth_ratio,
        "stalled_ranks": list(evidence.stalled_ranks),
        "seconds_since_last_step": evidence.seconds_since_last_step,
        "busiest_link": evidence.busiest_link,
        "busiest_link_utilization": evidence.busiest_link_utilization,
        "sm_active_ratio": evidence.sm_active_ratio,
        "sm_occupancy_ratio": evidence.sm_occupancy_ratio,
        "tensor_active_ratio": evidence.tensor_active_ratio,
        "dram_active_ratio": evidence.dram_active_ratio,
        "pipe_active_ratio": dict(evidence.pipe_active),
        "gpm_gpus": list(evidence.gpm_gpus),
        "memory_used_ratio": evidence.memory_used_ratio,
        "memory_full_gpus": list(evidence.memory_full_gpus),
        "storage_mountpoint": evidence.storage_mountpoint,
        "storage_source": evidence.storage_source,
        "storage_read_bytes_per_second": evidence.storage_read_bytes_per_second,
        "storage_read_rtt_seconds": evidence.storage_read_rtt_seconds,
    }


def _nccl_entry(problem: NcclState, lang: str) -> NcclEntry:
    return {
        "pid": problem.pid,
        "problem": problem.problem,
        "variable": problem.variable,
        "value": problem.value,
        "message": nccl_text(problem.problem, problem.variable, problem.value, lang),
    }
