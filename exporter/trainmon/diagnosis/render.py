"""The report as text for a human (``trainmon doctor`` without ``--json``).

``render_text`` prints a ``report.Report`` in its language, in the order an
engineer checks: the platform (instance, spot state, a scheduled reclaim),
GPU (with NUMA binding), storage (disks, NFS/CFS mounts, checkpoints), network,
then each job's verdict with its findings — risk findings marked
``[CRITICAL]``/``[WARNING]`` (``[严重]``/``[警告]``) — and the next action;
``render_history`` adds doctor's run-ledger lines. Every word comes from
``text``, label values (severity, storage kind, provider) included; this
module only lays the lines out.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmon.diagnosis.report import (
    CheckpointEntry,
    DiskEntry,
    FindingEntry,
    GPUEntry,
    LinkEntry,
    NetworkJobEntry,
    NfsEntry,
    NumaSection,
    PlatformSection,
    Report,
)
from trainmon.diagnosis.risks import utc_text
from trainmon.diagnosis.text import (
    count_text,
    heading,
    provider_name,
    rate_text,
    render,
    severity_tag,
    storage_name,
    word,
)
from trainmon.runs.compare import signed_percent
from trainmon.runs.regression import Regression
from trainmon.runs.timespec import utc_text as run_time_text


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

    lines += ["", heading("platform", lang)]
    lines += _platform_lines(report["platform"], lang)

    lines += ["", heading("gpu", lang)]
    lines += [_gpu_line(gpu, lang) for gpu in report["gpus"]] or [f"   {heading('no_gpu', lang)}"]
    if report["gpus"] and all(gpu["sm_active_ratio"] is None for gpu in report["gpus"]):
        lines.append(f"   {word('no_gpm', lang)}")
    lines += _numa_lines(report["numa"], lang)

    lines += ["", heading("storage", lang)]
    for waiting in report["storage"]["jobs"]:
        lines.append(f"   {word('job', lang)} {waiting['job']}: {word('data_wait', lang)} "
                     f"{_percent(waiting['data_wait_ratio'])} (rank {waiting['rank']})")
    lines += [_disk_line(disk, lang) for disk in report["storage"]["disks"]]
    lines += [_nfs_line(mount, lang) for mount in report["storage"]["nfs"]]
    lines += [_checkpoint_line(entry, lang) for entry in report["storage"]["checkpoints"]]
    if not any(report["storage"][key] for key in ("jobs", "disks", "nfs", "checkpoints")):
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
        lines += [f"      + {_severity(finding, lang)}{finding['message']}" for finding in others
                  if finding["kind"] != job["kind"] or finding["code"] != deciding["code"]]
        lines += [f"      ! NCCL: {problem['message']}" for problem in job["nccl"]]
        if job["advice"]:
            lines.append(f"      {heading('next', lang)}: {job['advice']}")
    lines.append("")
    status = report["status"]
    lines.append(heading("found", lang) if status == "bottleneck" else
                 heading("risk", lang) if status == "risk" else
                 heading("healthy", lang) if status == "healthy" else
                 heading("unmeasured", lang, reason=report["reason"]))
    return "\n".join(lines) + "\n"


def render_history(regressions: Sequence[Regression], lang: str) -> str:
    """doctor's lines for jobs slower than their previous comparable run; "" for none."""
    if not regressions:
        return ""
    lines = ["", heading("history", lang)]
    lines += [f"   {found.job}: " + render(word("slower_run", lang), {
        "change": signed_percent(found.change_ratio), "run": found.run,
        "previous_run": found.previous_run, "started": run_time_text(found.previous_started),
    }) for found in regressions]
    return "\n".join(lines) + "\n"


def _severity(finding: FindingEntry, lang: str) -> str:
    """``[CRITICAL] `` before a risk finding's message; nothing for the verdict's."""
    severity = finding["severity"]
    return f"[{severity_tag(severity, lang)}] " if severity else ""


def _platform_lines(platform: PlatformSection, lang: str) -> list[str]:
    """``tencent ins-1 (GN10X), region …, zone …, leaf …`` and the spot state."""
    if not platform["provider"] and platform["spot"] is None and platform["metadata_up"] is None:
        return [f"   {heading('no_platform', lang)}"]
    identity = [provider_name(platform["provider"], lang) if platform["provider"]
                else word("unknown", lang)]
    if platform["instance_id"]:
        instance = f"{word('instance', lang)} {platform['instance_id']}"
        if platform["instance_type"]:
            instance += f" ({platform['instance_type']})"
        identity.append(instance)
    for key in ("region", "zone"):
        if platform[key]:
            identity.append(f"{word(key, lang)} {platform[key]}")
    identity += [f"{name} {value}" for name, value in sorted(platform["labels"].items())]
    spot = platform["spot"]
    metadata = platform["metadata_up"]
    state = [
        f"{word('spot', lang)}: "
        f"{word('unknown' if spot is None else 'yes' if spot else 'no', lang)}",
        f"{word('metadata', lang)}: "
        f"{word('unknown' if metadata is None else 'up' if metadata else 'down', lang)}",
    ]
    at, seconds = platform["termination_timestamp"], platform["termination_seconds"]
    state.append(word("no_reclaim", lang) if at is None else render(
        word("reclaim_at", lang), {"at": utc_text(at), "seconds": seconds or 0.0}))
    lines = [f"   {', '.join(identity)}", f"   {'; '.join(state)}"]
    lines += [f"   ! {_severity(finding, lang)}{finding['message']}"
              for finding in platform["findings"]]
    return lines


def _numa_lines(numa: NumaSection, lang: str) -> list[str]:
    """Each process's CPU share on its GPU's NUMA node; "unknown" where numa_node is -1."""
    lines = []
    unknown = [entry["gpu"] for entry in numa["gpus"] if entry["numa_node"] < 0]
    if unknown:
        lines.append(f"   NUMA gpu {','.join(unknown)}: {word('numa_unknown', lang)}")
    for process in numa["processes"]:
        owner = f" ({word('job', lang)} {process['job']})" if process["job"] else ""
        line = (f"   NUMA gpu {process['gpu']} ({word('numa_node', lang)} "
                f"{process['numa_node']}): pid {process['pid']}{owner} "
                f"{_percent(process['local_ratio'])} {word('numa_local', lang)}")
        lines.append(line + (f" [{word('numa_far', lang)}]" if process["status"] == "far"
                             else ""))
    if numa["gpus"] and not unknown and not numa["processes"]:
        lines.append(f"   NUMA: {word('numa_no_ratio', lang)}")
    return lines


def _nfs_line(mount: NfsEntry, lang: str) -> str:
    """``nfs4 10.0.0.8:/cfs at /mnt/cfs (v4.1): read 180.0 MB/s, write 0 B/s, 12 ms per READ``."""
    source = f"{mount['server']}:{mount['export']}" if mount["server"] else mount["export"]
    version = f" (v{mount['version']})" if mount["version"] else ""
    line = (f"   {mount['fstype'] or 'nfs'} {source} {mount['mountpoint']}{version}: "
            f"{word('read', lang)} {_rate(mount['read_bytes_per_second'])}, "
            f"{word('write', lang)} {_rate(mount['write_bytes_per_second'])}")
    if mount["read_rtt_seconds"] is not None:
        line += ", " + render(word("nfs_reads", lang),
                              {"milliseconds": mount["read_rtt_seconds"] * 1000})
    return line


def _checkpoint_line(entry: CheckpointEntry, lang: str) -> str:
    """``job llm: last checkpoint 300 s ago (took 12.0 s, 4 checkpoints), /mnt/cfs (…)``."""
    line = f"   {word('job', lang)} {entry['job']}: "
    if entry["age_seconds"] is None:
        line += word("no_checkpoint", lang)
    else:
        details = []
        if entry["last_duration_seconds"] is not None:
            details.append(render(word("took", lang),
                                  {"seconds": entry["last_duration_seconds"]}))
        if entry["checkpoints"] is not None:
            details.append(count_text("checkpoints", entry["checkpoints"], lang))
        line += (render(word("checkpoint_age", lang), {"age": entry["age_seconds"]})
                 + (f" ({', '.join(details)})" if details else ""))
    if entry["mountpoint"]:
        line += (f", {entry['mountpoint']} ({entry['fstype']}, "
                 f"{storage_name(entry['storage'], lang)})")
    return line


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
    return rate_text(value)
