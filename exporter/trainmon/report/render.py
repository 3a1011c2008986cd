"""The report as text for a human (``trainmon doctor`` without ``--json``).

``render_text`` prints a ``model.Report`` in its language, in the order an
engineer checks: the platform (instance, spot state, a scheduled reclaim),
GPU (with NUMA binding), storage (disks, NFS/CFS mounts, checkpoints), network,
then each job's verdict with its findings — risk findings marked
``[CRITICAL]``/``[WARNING]`` (``[严重]``/``[警告]``) — and the next action.
It reads the same dataclasses as the JSON (``document``), so the two always
agree. Every word comes from ``messages``, label values (severity, storage
kind, provider) included; this module only lays the lines out. Each line goes
through ``trainmon.terminal.one_line``: a label value (a stall's frame, a job
name) can neither start a line of its own nor reach the terminal as an escape
sequence.
"""

from __future__ import annotations

from trainmon.diagnosis.finding import Finding
from trainmon.diagnosis.measure import DiskState, JobGoodput
from trainmon.diagnosis.platform_signals import NfsMount
from trainmon.diagnosis.risks import utc_text
from trainmon.diagnosis.rules import Verdict
from trainmon.report.history import History, PastRun, history_lines, recent_lines
from trainmon.report.messages import (
    finding_text,
    heading,
    history_text,
    hung_rank_lines,
    kind_name,
    nccl_text,
    provider_name,
    rate_text,
    render,
    severity_tag,
    storage_name,
    word,
)
from trainmon.report.model import GPU, Checkpoint, Link, NumaBinding, Platform, Report, advice
from trainmon.terminal import one_line


def render_text(report: Report) -> str:
    """The human report, in ``report.lang``."""
    lang = report.lang
    source = report.source
    lines: list[str] = []
    if "seconds" not in source:  # nothing was measured
        lines.append(heading("title_failed", lang, url=source.get("url", "")))
    elif source.get("url"):
        lines.append(heading("title_url", lang, url=source["url"], seconds=source["seconds"]))
    else:
        lines.append(heading("title_local", lang, seconds=source["seconds"]))
    if report.status in ("unmeasured", "ended") and not report.gpus and not report.verdicts:
        lines += recent_lines(report.history, lang)
        lines += ["", heading("ended", lang) if report.status == "ended"
                  else heading("unmeasured", lang, reason=report.reason_in(lang))]
        return _text(lines)

    lines += ["", heading("platform", lang)]
    lines += _platform_lines(report.platform, lang)

    lines += ["", heading("gpu", lang)]
    lines += [_gpu_line(gpu, lang) for gpu in report.gpus] or [f"   {heading('no_gpu', lang)}"]
    if report.gpus and all(gpu.state.sm_active is None for gpu in report.gpus):
        lines.append(f"   {word('no_gpm', lang)}")
    lines += _numa_lines(report, lang)

    lines += ["", heading("storage", lang)]
    for waiting in report.waiting_for_data:
        lines.append(f"   {word('job', lang)} {waiting.job}: {word('data_wait', lang)} "
                     f"{_percent(waiting.evidence.data_wait_ratio)} "
                     f"(rank {waiting.evidence.worst_data_wait_rank})")
    lines += [_disk_line(disk, lang) for disk in report.disks]
    lines += [_nfs_line(mount, lang) for mount in report.nfs]
    lines += [_checkpoint_line(checkpoint, lang, _current(report, checkpoint.state.job))
              for checkpoint in report.checkpoints]
    if not (report.waiting_for_data or report.disks or report.nfs or report.checkpoints):
        lines.append(f"   {heading('no_disks', lang)}")

    lines += ["", heading("network", lang)]
    lines += [_communication_line(job, lang) for job in report.communicating]
    lines += [_link_line(link, lang) for link in report.links]
    if not report.communicating and not report.links:
        lines.append(f"   {heading('no_links', lang)}")
    lines += [f"   NCCL pid {p.pid}: {nccl_text(p.problem, p.variable, p.value, lang)}"
              for p in report.nccl]

    lines += ["", heading("verdict", lang)]
    if not report.verdicts:
        lines.append(f"   {heading('no_jobs', lang)}")
    goodput = {job.job: job for job in report.goodput}
    for verdict in report.verdicts:
        head, *rest = verdict_lines(verdict, lang, report.history)
        line = goodput_line(goodput.get(verdict.job), lang, _current(report, verdict.job))
        lines += [head, *([line] if line else []), *rest]
    lines += history_lines(report.history, lang)
    lines += recent_lines(report.history, lang)
    lines.append("")
    status = report.status
    lines.append(heading("found", lang) if status == "bottleneck" else
                 heading("risk", lang) if status == "risk" else
                 heading("healthy", lang) if status == "healthy" else
                 heading("ended", lang) if status == "ended" else
                 heading("unmeasured", lang, reason=report.reason_in(lang)))
    return _text(lines)


def _current(report: Report, job: str) -> PastRun | None:
    """The run of ``job`` that goes on, as the node's ledger records it."""
    return None if report.history is None else report.history.current(job)


def _text(lines: list[str]) -> str:
    """The lines as printed: one each, nothing a terminal acts on."""
    return "".join(one_line(line) + "\n" for line in lines)


def verdict_lines(verdict: Verdict, lang: str, history: History | None = None) -> list[str]:
    """``llm: STORAGE — …``, the other findings (``+``), NCCL problems (``!``), next steps
    (a compute verdict's with the job's latest profile in ``history``, the node's
    ledger)."""
    deciding, *others = verdict.findings
    lines = [f"   {verdict.job}: {kind_name(verdict.kind, lang).upper()} — "
             f"{_message(deciding, lang)}"]
    lines += [f"      + {_severity(finding, lang)}{_message(finding, lang)}" for finding in others
              if finding.kind != verdict.kind or finding.code != deciding.code]
    lines += [f"      ! NCCL: {nccl_text(p.problem, p.variable, p.value, lang)}"
              for p in verdict.nccl]
    for finding in verdict.findings:
        if finding.code == "hung_rank":
            lines += [f"      {line}" for line in hung_rank_lines(finding.values, lang)]
    if next_steps := advice(verdict, lang, history):
        lines.append(f"      {heading('next', lang)}: {next_steps}")
    return lines


def goodput_line(goodput: JobGoodput | None, lang: str, run: PastRun | None = None
                 ) -> str | None:
    """``      goodput 42 % of its GPU time (largest loss: data_wait, 38 % …)``; None
    without a goodput. With the run that goes on (``run``, from the node's ledger): that
    run's goodput and largest loss, not a window's that may span the run before."""
    if run is not None and run.goodput_ratio is not None:
        ratio = f"{run.goodput_ratio * 100:.0f} %"
        if run.largest_loss is None or run.largest_loss_share is None:
            return f"      {heading('goodput_run_only', lang, ratio=ratio, run=run.record.run)}"
        return "      " + heading("goodput_run", lang, ratio=ratio, run=run.record.run,
                                    loss=run.largest_loss,
                                    share=f"{run.largest_loss_share * 100:.0f} %")
    if goodput is None or goodput.ratio is None:
        return None
    ratio = f"{goodput.ratio * 100:.0f} %"
    if goodput.largest_loss is None or goodput.largest_loss_share is None:
        return f"      {heading('goodput_only', lang, ratio=ratio)}"
    return "      " + heading("goodput", lang, ratio=ratio, loss=goodput.largest_loss,
                                share=f"{goodput.largest_loss_share * 100:.0f} %")


def _message(finding: Finding, lang: str) -> str:
    return finding_text(finding.code, finding.values, lang)


def _severity(finding: Finding, lang: str) -> str:
    """``[CRITICAL] `` before a risk finding's message; nothing for the verdict's."""
    return f"[{severity_tag(finding.severity, lang)}] " if finding.severity else ""


def _platform_lines(platform: Platform, lang: str) -> list[str]:
    """``tencent ins-1 (GN10X), region …, zone …, leaf …`` and the spot state."""
    node = platform.node
    if not node.provider and node.spot is None and node.metadata_up is None:
        return [f"   {heading('no_platform', lang)}"]
    identity = [provider_name(node.provider, lang) if node.provider else word("unknown", lang)]
    if node.instance_id:
        instance = f"{word('instance', lang)} {node.instance_id}"
        if node.instance_type:
            instance += f" ({node.instance_type})"
        identity.append(instance)
    for key, value in (("region", node.region), ("zone", node.zone)):
        if value:
            identity.append(f"{word(key, lang)} {value}")
    identity += [f"{name} {value}" for name, value in sorted(node.labels)]
    spot, metadata = node.spot, node.metadata_up
    state = [
        f"{word('spot', lang)}: "
        f"{word('unknown' if spot is None else 'yes' if spot else 'no', lang)}",
        f"{word('metadata', lang)}: "
        f"{word('unknown' if metadata is None else 'up' if metadata else 'down', lang)}",
    ]
    at = node.termination_timestamp
    state.append(word("no_reclaim", lang) if at is None else render(
        word("reclaim_at", lang),
        {"at": utc_text(at), "seconds": platform.termination_seconds or 0.0}))
    lines = [f"   {', '.join(identity)}", f"   {'; '.join(state)}"]
    lines += [f"   ! {_severity(finding, lang)}{_message(finding, lang)}"
              for finding in platform.findings]
    return lines


def _numa_lines(report: Report, lang: str) -> list[str]:
    """Each process's CPU share on its GPU's NUMA node; "unknown" where numa_node is -1."""
    lines = []
    unknown = [gpu for gpu, numa_node in report.gpu_numa_nodes if numa_node < 0]
    if unknown:
        lines.append(f"   NUMA gpu {','.join(unknown)}: {word('numa_unknown', lang)}")
    lines += [_numa_line(binding, lang) for binding in report.numa]
    if report.gpu_numa_nodes and not unknown and not report.numa:
        lines.append(f"   NUMA: {word('numa_no_ratio', lang)}")
    return lines


def _numa_line(binding: NumaBinding, lang: str) -> str:
    process = binding.process
    owner = f" ({word('job', lang)} {binding.job})" if binding.job else ""
    line = (f"   NUMA gpu {process.gpu} ({word('numa_node', lang)} "
            f"{binding.numa_node}): pid {process.pid}{owner} "
            f"{_percent(process.local_ratio)} {word('numa_local', lang)}")
    return line + (f" [{word('numa_far', lang)}]" if binding.far else "")


def _nfs_line(mount: NfsMount, lang: str) -> str:
    """``nfs4 10.0.0.8:/cfs at /mnt/cfs (v4.1): read 180.0 MB/s, write 0 B/s, 12 ms per READ``."""
    version = f" (v{mount.version})" if mount.version else ""
    line = (f"   {mount.fstype or 'nfs'} {mount.source} {mount.mountpoint}{version}: "
            f"{word('read', lang)} {_rate(mount.read_bytes_per_second)}, "
            f"{word('write', lang)} {_rate(mount.write_bytes_per_second)}")
    if mount.read_rtt_seconds is not None:
        line += ", " + render(word("nfs_reads", lang),
                              {"milliseconds": mount.read_rtt_seconds * 1000})
    return line


def _checkpoint_line(checkpoint: Checkpoint, lang: str, run: PastRun | None = None) -> str:
    """``job llm: last checkpoint 300 s ago (took 12.0 s, 8 checkpoint saves by its ranks
    in run r-7), /mnt/cfs (…)``: the count of the run that goes on (``run``, from the
    node's ledger), else the job's counter, which spans all its runs since the daemon
    started."""
    state, storage = checkpoint.state, checkpoint.storage
    line = f"   {word('job', lang)} {state.job}: "
    if checkpoint.age_seconds is None:
        line += word("no_checkpoint", lang)
    else:
        details = []
        if state.last_duration_seconds is not None:
            details.append(render(word("took", lang), {"seconds": state.last_duration_seconds}))
        if run is not None and run.checkpoint_saves is not None:
            details.append(history_text("checkpoint_saves", lang,
                                        count=run.checkpoint_saves, run=run.record.run))
        elif state.checkpoints is not None:
            details.append(history_text("checkpoints_all_runs", lang,
                                        count=state.checkpoints))
        line += (render(word("checkpoint_age", lang), {"age": checkpoint.age_seconds})
                 + (f" ({', '.join(details)})" if details else ""))
    if storage.mountpoint:
        line += (f", {storage.mountpoint} ({storage.fstype}, "
                 f"{storage_name(storage.storage, lang)})")
    return line


def _gpu_line(gpu: GPU, lang: str) -> str:
    state = gpu.state
    parts = [f"   gpu {state.gpu}: {_percent(state.utilization)} {word('busy', lang)}"]
    if state.sawtooth is not None:
        parts.append(f"{word('sawtooth', lang)} {state.sawtooth:.2f}")
    for key, ratio in (("sm_active", state.sm_active),
                       ("sm_occupancy", state.sm_occupancy),
                       ("tensor_active", state.tensor_active),
                       ("dram_active", state.dram_active)):
        if ratio is not None:
            parts.append(f"{word(key, lang)} {_percent(ratio)}")
    used, total = state.memory_used_bytes, state.memory_total_bytes
    if used is not None and total:
        parts.append(f"{used / 2**30:.1f} {word('memory_of', lang)} {total / 2**30:.1f} "
                     f"{word('used', lang)} ({_percent(used / total)})")
    elif used is not None:
        parts.append(f"{used / 2**30:.1f} {word('used', lang)}")
    owners = []
    if gpu.job:
        owners.append(f"{word('job', lang)} {gpu.job} rank {gpu.rank}")
    for owned in gpu.processes:
        process = owned.process
        where = (f"pod {process.namespace}/{process.pod}" if process.pod
                 else f"slurm {process.slurm_job}" if process.slurm_job else "")
        owners.append(f"pid {process.pid} ({owned.job}{', ' + where if where else ''})")
    line = ", ".join(parts)
    return f"{line} — {'; '.join(owners)}" if owners else line


def _communication_line(verdict: Verdict, lang: str) -> str:
    """``job llm: communication 12% (measured exposed; overlapped 30%, 9.1 GB/s)``."""
    evidence = verdict.evidence
    source = evidence.comm_source
    details = [word(f"comm_{source}", lang)] if source else []
    if evidence.comm_overlapped_ratio is not None:
        details.append(f"{word('overlapped', lang)} {_percent(evidence.comm_overlapped_ratio)}")
    if evidence.comm_bytes_per_second is not None:
        details.append(f"{_rate(evidence.comm_bytes_per_second)} {word('in_flight', lang)}")
    line = (f"   {word('job', lang)} {verdict.job}: {word('communication', lang)} "
            f"{_percent(evidence.comm_ratio)}")
    return f"{line} ({'; '.join(details)})" if details else line


def _disk_line(disk: DiskState, lang: str) -> str:
    return (f"   {word('disk', lang)} {disk.device}: {_percent(disk.busy_ratio)} "
            f"{word('busy', lang)}, {word('read', lang)} {_rate(disk.read_bytes_per_second)}, "
            f"{word('write', lang)} {_rate(disk.write_bytes_per_second)}")


def _link_line(link: Link, lang: str) -> str:
    state = link.state
    name = f"{state.device} {word('port', lang)} {state.port}" if state.port else state.device
    line = (f"   {name}: {word('receive', lang)} {_rate(state.receive_bytes_per_second)}, "
            f"{word('transmit', lang)} {_rate(state.transmit_bytes_per_second)}")
    if state.utilization is not None:
        line += (f" ({_percent(state.utilization)} {word('of', lang)} "
                 f"{_rate(state.rate_bytes_per_second)})")
    return line


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _rate(value: float | None) -> str:
    """Bytes per second in decimal units (as link rates are quoted)."""
    return rate_text(value)
