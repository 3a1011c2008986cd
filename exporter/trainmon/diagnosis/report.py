"""The diagnosis as a report: JSON-ready data and its human text (``trainmon doctor``).

``build_report`` turns a window into the ``--json`` document; ``render_text``
prints it in the order an engineer checks — GPU, storage, network — followed
by each job's verdict, its evidence and the next action, in English or
Chinese (``text``). The JSON keys are stable; the messages follow ``lang``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from trainmon.diagnosis.config import DiagnosisConfig
from trainmon.diagnosis.measure import NodeMeasurements, measure
from trainmon.diagnosis.rules import ACTIONABLE_KINDS, Verdict, diagnose, process_jobs
from trainmon.diagnosis.samples import Window
from trainmon.diagnosis.text import (
    advice_text,
    finding_text,
    heading,
    kind_name,
    nccl_text,
    word,
)

#: ``status`` → ``doctor`` exit code.
EXIT_CODES = {"healthy": 0, "bottleneck": 1, "unmeasured": 2}
Report = dict[str, Any]


def build_report(
    window: Window, config: DiagnosisConfig, source: dict[str, object], lang: str = "en"
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
            "disks": [asdict(disk) for disk in node.disks],
        },
        "network": {
            "jobs": [{"job": v.job, "comm_ratio": v.evidence.comm_ratio}
                     for v in verdicts if v.evidence.comm_ratio is not None],
            "links": [{**asdict(link), "utilization_ratio": link.utilization}
                      for link in node.links],
            "nccl": [_nccl_entry(asdict(problem), lang) for problem in node.nccl],
        },
        "jobs": [_job_entry(verdict, lang) for verdict in verdicts],
        "status": status,
        "reason": reason,
        "exit_code": EXIT_CODES[status],
    }


def unmeasured_report(source: dict[str, object], reason: str, lang: str = "en") -> Report:
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


def _gpu_section(node: NodeMeasurements) -> list[dict[str, Any]]:
    rank_of_gpu = {rank.gpu: rank for rank in node.ranks if rank.gpu}
    jobs = process_jobs(node)
    section: list[dict[str, Any]] = []
    for gpu in node.gpus:
        rank = rank_of_gpu.get(gpu.gpu)
        section.append({
            "gpu": gpu.gpu,
            "utilization_ratio": gpu.utilization,
            "sawtooth_ratio": gpu.sawtooth,
            "memory_used_bytes": gpu.memory_used_bytes,
            "job": rank.job if rank else "",
            "rank": rank.rank if rank else "",
            "processes": [
                {**asdict(process), "job": jobs[process]}
                for process in node.processes if process.gpu == gpu.gpu
            ],
        })
    return section


def _job_entry(verdict: Verdict, lang: str) -> dict[str, object]:
    return {
        "job": verdict.job,
        "kind": verdict.kind,
        "kind_name": kind_name(verdict.kind, lang),
        "findings": [
            {"kind": finding.kind, "code": finding.code, "values": finding.values,
             "message": finding_text(finding.code, finding.values, lang)}
            for finding in verdict.findings
        ],
        "evidence": asdict(verdict.evidence),
        "advice": advice_text(verdict.findings[0].code, lang),
        "nccl": [_nccl_entry(asdict(problem), lang) for problem in verdict.nccl],
    }


def _nccl_entry(problem: dict[str, Any], lang: str) -> dict[str, Any]:
    message = nccl_text(problem["problem"], problem["variable"], problem["value"], lang)
    return {**problem, "message": message}


# -- text -----------------------------------------------------------------------


def render_text(report: Report) -> str:
    """The human report, in ``report["lang"]``."""
    lang = str(report.get("lang", "en"))
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

    lines += ["", heading("storage", lang)]
    for job in report["storage"]["jobs"]:
        lines.append(f"   {word('job', lang)} {job['job']}: {word('data_wait', lang)} "
                     f"{_percent(job['data_wait_ratio'])} (rank {job['rank']})")
    lines += [_disk_line(disk, lang) for disk in report["storage"]["disks"]]
    if not report["storage"]["jobs"] and not report["storage"]["disks"]:
        lines.append(f"   {heading('no_disks', lang)}")

    lines += ["", heading("network", lang)]
    for job in report["network"]["jobs"]:
        lines.append(f"   {word('job', lang)} {job['job']}: {word('communication', lang)} "
                     f"{_percent(job['comm_ratio'])}")
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


def _gpu_line(gpu: dict[str, Any], lang: str) -> str:
    parts = [f"   gpu {gpu['gpu']}: {_percent(gpu['utilization_ratio'])} {word('busy', lang)}"]
    if gpu["sawtooth_ratio"] is not None:
        parts.append(f"{word('sawtooth', lang)} {gpu['sawtooth_ratio']:.2f}")
    if gpu["memory_used_bytes"] is not None:
        parts.append(f"{gpu['memory_used_bytes'] / 2**30:.1f} {word('used', lang)}")
    owners = []
    if gpu["job"]:
        owners.append(f"{word('job', lang)} {gpu['job']} rank {gpu['rank']}")
    for process in gpu["processes"]:
        where = (f"pod {process['namespace']}/{process['pod']}" if process["pod"]
                 else f"slurm {process['slurm_job']}" if process["slurm_job"] else "")
        owners.append(f"pid {process['pid']} ({process['job']}{', ' + where if where else ''})")
    line = ", ".join(parts)
    return f"{line} — {'; '.join(owners)}" if owners else line


def _disk_line(disk: dict[str, Any], lang: str) -> str:
    return (f"   {word('disk', lang)} {disk['device']}: {_percent(disk['busy_ratio'])} "
            f"{word('busy', lang)}, {word('read', lang)} {_rate(disk['read_bytes_per_second'])}, "
            f"{word('write', lang)} {_rate(disk['write_bytes_per_second'])}")


def _link_line(link: dict[str, Any], lang: str) -> str:
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
