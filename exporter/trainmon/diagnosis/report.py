"""The diagnosis as a report: JSON-ready data and its human text (``trainmon doctor``).

``build_report`` turns a window into the ``--json`` document; ``render_text``
prints it in the order an engineer checks — GPU, storage, network — followed
by each job's verdict, its evidence and the next action, in English or
Chinese (``text``). The JSON keys are stable; the messages follow ``lang``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from trainmon.diagnosis.config import DiagnosisConfig
from trainmon.diagnosis.measure import (
    DiskState,
    GPUProcessState,
    LinkState,
    NcclState,
    NodeMeasurements,
    measure,
)
from trainmon.diagnosis.rules import (
    ACTIONABLE_KINDS,
    Evidence,
    Verdict,
    diagnose,
    process_jobs,
)
from trainmon.diagnosis.samples import Window
from trainmon.diagnosis.text import (
    EXTRA_ADVICE,
    advice_text,
    finding_text,
    heading,
    kind_name,
    nccl_text,
    word,
)

#: ``status`` → ``doctor`` exit code.
EXIT_CODES = {"healthy": 0, "bottleneck": 1, "unmeasured": 2}


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


class StorageSection(TypedDict):
    jobs: list[StorageJobEntry]
    disks: list[DiskEntry]


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
    values: dict[str, float | str]
    message: str


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
    gpus: list[GPUEntry]
    storage: StorageSection
    network: NetworkSection
    jobs: list[JobEntry]
    status: str  # "healthy", "bottleneck" or "unmeasured"
    #: Why nothing could be measured; empty otherwise.
    reason: str
    exit_code: int


def build_report(
    window: Window, config: DiagnosisConfig, source: Source, lang: str = "en"
) -> Report:
    """The whole report as JSON-ready data."""
    node = measure(window, config.comm_phases)
    verdicts = diagnose(node, config)
    status, reason = _status(node, verdicts)
    return {
        "source": {**source, "seconds": round(window.seconds, 3),
                   "snapshots": len(window.snapshots)},
        "lang": lang,
        "gpus": _gpu_section(node),
        "storage": {
            "jobs": [{"job": v.job, "data_wait_ratio": v.evidence.data_wait_ratio,
                      "rank": v.evidence.worst_data_wait_rank}
                     for v in verdicts if v.evidence.data_wait_ratio is not None],
            "disks": [_disk_entry(disk) for disk in node.disks],
        },
        "network": {
            "jobs": [{"job": v.job, "comm_ratio": v.evidence.comm_ratio,
                      "comm_source": v.evidence.comm_source,
                      "comm_overlapped_ratio": v.evidence.comm_overlapped_ratio,
                      "comm_bytes_per_second": v.evidence.comm_bytes_per_second}
                     for v in verdicts if v.evidence.comm_ratio is not None],
            "links": [_link_entry(link) for link in node.links],
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
        "source": source, "lang": lang, "gpus": [],
        "storage": {"jobs": [], "disks": []},
        "network": {"jobs": [], "links": [], "nccl": []},
        "jobs": [], "status": "unmeasured", "reason": reason,
        "exit_code": EXIT_CODES["unmeasured"],
    }


def _status(node: NodeMeasurements, verdicts: Sequence[Verdict]) -> tuple[str, str]:
    """``bottleneck`` if any verdict needs action; ``healthy`` if something was measured
    and nothing needs action; else ``unmeasured`` with the reason."""
    if any(verdict.kind in ACTIONABLE_KINDS for verdict in verdicts):
        return "bottleneck", ""
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


def _link_entry(link: LinkState) -> LinkEntry:
    return {
        "kind": link.kind,
        "device": link.device,
        "port": link.port,
        "receive_bytes_per_second": link.receive_bytes_per_second,
        "transmit_bytes_per_second": link.transmit_bytes_per_second,
        "rate_bytes_per_second": link.rate_bytes_per_second,
        "utilization_ratio": link.utilization,
    }


def _job_entry(verdict: Verdict, lang: str) -> JobEntry:
    return {
        "job": verdict.job,
        "kind": verdict.kind,
        "kind_name": kind_name(verdict.kind, lang),
        "findings": [
            {"kind": finding.kind, "code": finding.code, "values": finding.values,
             "message": finding_text(finding.code, finding.values, lang)}
            for finding in verdict.findings
        ],
        "evidence": _evidence_entry(verdict.evidence),
        "advice": _advice(verdict, lang),
        "nccl": [_nccl_entry(problem, lang) for problem in verdict.nccl],
    }


def _advice(verdict: Verdict, lang: str) -> str:
    """The deciding finding's next step, then those of findings that need one
    wherever they stand (``text.EXTRA_ADVICE``: an out-of-memory risk)."""
    codes = [verdict.findings[0].code]
    codes += [finding.code for finding in verdict.findings[1:]
              if finding.code in EXTRA_ADVICE and finding.code not in codes]
    return " ".join(text for code in codes if (text := advice_text(code, lang)))


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
    }


def _nccl_entry(problem: NcclState, lang: str) -> NcclEntry:
    return {
        "pid": problem.pid,
        "problem": problem.problem,
        "variable": problem.variable,
        "value": problem.value,
        "message": nccl_text(problem.problem, problem.variable, problem.value, lang),
    }


# -- text -----------------------------------------------------------------------


def render_text(report: Report) -> str:
    """The human report, in ``report["lang"]``."""
    lang = report["lang"]
    source = report["source"]
    lines: list[str] = []
    if "seconds" not in source:  # nothing was measured
        lines.append(heading("title_failed", lang, url=source.get("url", "")))
    elif source.get("url"):
        lines.append(heading("title_url", lang, url=source["url"], seconds=source["seconds"]))
    else:
        lines.append(heading("title_local", lang, seconds=source["seconds"]))
    if report["status"] == "unmeasured" and not report["gpus"] and not report["jobs"]:
        lines += ["", heading("unmeasured", lang, reason=report["reason"])]
        return "\n".join(lines) + "\n"

    lines += ["", heading("gpu", lang)]
    lines += [_gpu_line(gpu, lang) for gpu in report["gpus"]] or [f"   {heading('no_gpu', lang)}"]
    if report["gpus"] and all(gpu["sm_active_ratio"] is None for gpu in report["gpus"]):
        lines.append(f"   {word('no_gpm', lang)}")

    lines += ["", heading("storage", lang)]
    for waiting in report["storage"]["jobs"]:
        lines.append(f"   {word('job', lang)} {waiting['job']}: {word('data_wait', lang)} "
                     f"{_percent(waiting['data_wait_ratio'])} (rank {waiting['rank']})")
    lines += [_disk_line(disk, lang) for disk in report["storage"]["disks"]]
    if not report["storage"]["jobs"] and not report["storage"]["disks"]:
        lines.append(f"   {heading('no_disks', lang)}")

    lines += ["", heading("network", lang)]
    lines += [_communication_line(job, lang) for job in report["network"]["jobs"]]
    lines += [_link_line(link, lang) for link in report["network"]["links"]]
    if not report["network"]["jobs"] and not report["network"]["links"]:
        lines.append(f"   {heading('no_links', lang)}")
    lines += [f"   NCCL pid {p['pid']}: {p['message']}" for p in report["network"]["nccl"]]

    lines += ["", heading("verdict", lang)]
    if not report["jobs"]:
        lines.append(f"   {heading('no_jobs', lang)}")
    for job in report["jobs"]:
        deciding, *others = job["findings"]
        lines.append(f"   {job['job']}: {job['kind_name'].upper()} — {deciding['message']}")
        lines += [f"      + {finding['message']}" for finding in others
                  if finding["kind"] != job["kind"] or finding["code"] != deciding["code"]]
        lines += [f"      ! NCCL: {problem['message']}" for problem in job["nccl"]]
        if job["advice"]:
            lines.append(f"      {heading('next', lang)}: {job['advice']}")
    lines.append("")
    status = report["status"]
    lines.append(heading("found", lang) if status == "bottleneck" else
                 heading("healthy", lang) if status == "healthy" else
                 heading("unmeasured", lang, reason=report["reason"]))
    return "\n".join(lines) + "\n"


def _gpu_line(gpu: GPUEntry, lang: str) -> str:
    parts = [f"   gpu {gpu['gpu']}: {_percent(gpu['utilization_ratio'])} {word('busy', lang)}"]
    if gpu["sawtooth_ratio"] is not None:
        parts.append(f"{word('sawtooth', lang)} {gpu['sawtooth_ratio']:.2f}")
    for key, ratio in (("sm_active", gpu["sm_active_ratio"]),
                       ("sm_occupancy", gpu["sm_occupancy_ratio"]),
                       ("tensor_active", gpu["tensor_active_ratio"]),
                       ("dram_active", gpu["dram_active_ratio"])):
        if ratio is not None:
            parts.append(f"{word(key, lang)} {_percent(ratio)}")
    used, total = gpu["memory_used_bytes"], gpu["memory_total_bytes"]
    if used is not None and total:
        parts.append(f"{used / 2**30:.1f} {word('memory_of', lang)} {total / 2**30:.1f} "
                     f"{word('used', lang)} ({_percent(used / total)})")
    elif used is not None:
        parts.append(f"{used / 2**30:.1f} {word('used', lang)}")
    owners = []
    if gpu["job"]:
        owners.append(f"{word('job', lang)} {gpu['job']} rank {gpu['rank']}")
    for process in gpu["processes"]:
        where = (f"pod {process['namespace']}/{process['pod']}" if process["pod"]
                 else f"slurm {process['slurm_job']}" if process["slurm_job"] else "")
        owners.append(f"pid {process['pid']} ({process['job']}{', ' + where if where else ''})")
    line = ", ".join(parts)
    return f"{line} — {'; '.join(owners)}" if owners else line


def _communication_line(job: NetworkJobEntry, lang: str) -> str:
    """``job llm: communication 12% (measured exposed; overlapped 30%, 9.1 GB/s)``."""
    source = job["comm_source"]
    details = [word(f"comm_{source}", lang)] if source else []
    if job["comm_overlapped_ratio"] is not None:
        details.append(f"{word('overlapped', lang)} {_percent(job['comm_overlapped_ratio'])}")
    if job["comm_bytes_per_second"] is not None:
        details.append(f"{_rate(job['comm_bytes_per_second'])} {word('in_flight', lang)}")
    line = (f"   {word('job', lang)} {job['job']}: {word('communication', lang)} "
            f"{_percent(job['comm_ratio'])}")
    return f"{line} ({'; '.join(details)})" if details else line


def _disk_line(disk: DiskEntry, lang: str) -> str:
    return (f"   {word('disk', lang)} {disk['device']}: {_percent(disk['busy_ratio'])} "
            f"{word('busy', lang)}, {word('read', lang)} {_rate(disk['read_bytes_per_second'])}, "
            f"{word('write', lang)} {_rate(disk['write_bytes_per_second'])}")


def _link_line(link: LinkEntry, lang: str) -> str:
    name = (f"{link['device']} {word('port', lang)} {link['port']}" if link["port"]
            else link["device"])
    line = (f"   {name}: {word('receive', lang)} {_rate(link['receive_bytes_per_second'])}, "
            f"{word('transmit', lang)} {_rate(link['transmit_bytes_per_second'])}")
    if link["utilization_ratio"] is not None:
        line += (f" ({_percent(link['utilization_ratio'])} {word('of', lang)} "
                 f"{_rate(link['rate_bytes_per_second'])})")
    return line


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _rate(value: float | None) -> str:
    """Bytes per second in decimal units (as link rates are quoted)."""
    if value is None:
        return "n/a"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B/s"
