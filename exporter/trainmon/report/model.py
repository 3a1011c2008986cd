"""The report of ``trainmon doctor``: the engine's results, and what the report adds.

``build_report`` runs the engine over a window (``measure``, ``diagnose``,
``node_findings``) and keeps its dataclasses as they are: the platform, GPUs
and NUMA binding, storage (disks, NFS/CFS mounts, checkpoints), network, then
each job's verdict with its findings and evidence. The report adds only what
it derives from them — each GPU's job, rank and processes, each checkpoint's
age and newest storage, each RDMA port's state, each NUMA binding's job and
status, the seconds to a reclaim, the status and exit code — in the small
dataclasses below, which hold the engine's objects rather than copy their
fields. ``document`` writes a report as the ``--json`` document, ``render`` as
text; both take their words from ``messages`` in ``lang``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from trainmon.diagnosis.finding import SEVERITIES, Finding
from trainmon.diagnosis.measure import (
    DiskState,
    GPUProcessState,
    GPUState,
    JobGoodput,
    LinkState,
    NcclState,
    NodeMeasurements,
    RankState,
    measure,
)
from trainmon.diagnosis.platform_signals import (
    CheckpointState,
    CheckpointStorage,
    NfsMount,
    NodePlatform,
    NumaProcess,
    PlatformMeasurements,
)
from trainmon.diagnosis.rules import (
    ACTIONABLE_KINDS,
    Verdict,
    diagnose,
    node_findings,
    numa_jobs,
    process_jobs,
)
from trainmon.diagnosis.samples import Window
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.report.history import History, profile_step
from trainmon.report.messages import EXTRA_ADVICE, advice_text, reason_text

#: ``status`` → ``doctor`` exit code: ``risk`` is no bottleneck but a critical or
#: warning finding (a spot reclaim, an overdue checkpoint...), which needs action too;
#: ``ended``: no GPU and no job now, but the ledger shows how the node's recent jobs
#: ended (doctor after the job), which is an answer.
EXIT_CODES = {"healthy": 0, "ended": 0, "bottleneck": 1, "risk": 1, "unmeasured": 2}
#: A checkpoint whose storage is unknown (no ``trainmon_training_checkpoint_storage_info``).
NO_STORAGE = CheckpointStorage("", "", "")


class _SourceKind(TypedDict):
    kind: str  # "url" or "local"


class Source(_SourceKind, total=False):
    """What was measured, as the document's ``source`` shows it: ``url`` for a
    daemon; ``seconds`` and ``snapshots`` once measured."""

    url: str
    seconds: float
    snapshots: int


@dataclass(frozen=True)
class GPUProcess:
    """A process on a GPU (who runs it) and the job it is counted in."""

    process: GPUProcessState
    job: str


@dataclass(frozen=True)
class GPU:
    """A GPU as the engine measured it, and who uses it."""

    state: GPUState
    #: The job and rank that report this GPU; empty strings when none does.
    job: str
    rank: str
    processes: tuple[GPUProcess, ...]


@dataclass(frozen=True)
class NumaBinding:
    """A GPU process's CPUs against its GPU's NUMA node."""

    process: NumaProcess
    job: str
    #: ``trainmon_gpu_numa_node`` of the process's GPU; None where not exported.
    numa_node: int | None
    #: Below ``numa_local_ratio_min`` on a known NUMA node.
    far: bool


@dataclass(frozen=True)
class Checkpoint:
    """A job that reports checkpoint fields (``trainmon_training_*checkpoint*``)."""

    state: CheckpointState
    #: Seconds since the last checkpoint, at the end of the window.
    age_seconds: float | None
    #: The mount of the newest checkpoint and its kind; ``NO_STORAGE`` when unknown.
    storage: CheckpointStorage


@dataclass(frozen=True)
class Link:
    """A NIC or an InfiniBand/RoCE port as the engine measured it."""

    state: LinkState
    #: InfiniBand/RoCE: whether the port is ACTIVE (``trainmon_infiniband_port_up``);
    #: None for a NIC or where not exported.
    port_up: bool | None


@dataclass(frozen=True)
class Platform:
    """The instance; empty strings and None where unknown."""

    node: NodePlatform
    #: Seconds left before a scheduled spot reclaim; None if none.
    termination_seconds: float | None
    #: Findings about the node itself (``spot_reclaim``).
    findings: tuple[Finding, ...]


@dataclass(frozen=True)
class Report:
    """One ``trainmon doctor`` report: sections in the order an engineer checks."""

    source: Source
    lang: str
    platform: Platform
    gpus: tuple[GPU, ...] = ()
    #: ``(gpu, NUMA node)``: -1 where the platform reports none (virtualised hosts).
    gpu_numa_nodes: tuple[tuple[str, int], ...] = ()
    numa: tuple[NumaBinding, ...] = ()
    disks: tuple[DiskState, ...] = ()
    checkpoints: tuple[Checkpoint, ...] = ()
    nfs: tuple[NfsMount, ...] = ()
    links: tuple[Link, ...] = ()
    nccl: tuple[NcclState, ...] = ()
    #: One per job, as ``rules.diagnose`` returns them (each deciding finding first).
    verdicts: tuple[Verdict, ...] = ()
    #: Each job's goodput, where the run ledger books it (a daemon's ``/metrics``).
    goodput: tuple[JobGoodput, ...] = ()
    #: Each reporting rank as the engine measured it (``trainmon top`` shows them).
    ranks: tuple[RankState, ...] = ()
    #: "healthy", "bottleneck", "risk", "ended" (``EXIT_CODES``) or "unmeasured".
    status: str = "unmeasured"
    #: Why nothing could be measured (English, the document's ``reason``); empty otherwise.
    reason: str = ""
    #: ``reason``'s key in ``messages.REASONS`` and its values, for the text in ``lang``;
    #: empty: ``reason`` as it is.
    reason_code: str = ""
    reason_values: tuple[tuple[str, str], ...] = ()
    #: The node's run ledger: each job's run against its baseline, the recent jobs'
    #: last runs (``trainmon doctor`` adds it, ``with_history``); None: no usable ledger.
    history: History | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def reason_in(self, lang: str) -> str:
        """``reason`` in ``lang``."""
        if not self.reason_code:
            return self.reason
        return reason_text(self.reason_code, lang, dict(self.reason_values))

    @property
    def waiting_for_data(self) -> tuple[Verdict, ...]:
        """The verdicts of jobs whose data wait was measured (the storage section)."""
        return tuple(v for v in self.verdicts if v.evidence.data_wait_ratio is not None)

    @property
    def communicating(self) -> tuple[Verdict, ...]:
        """The verdicts of jobs whose communication was measured (the network section)."""
        return tuple(v for v in self.verdicts if v.evidence.comm_ratio is not None)


def build_report(
    window: Window, config: DiagnosisConfig, source: Source, lang: str = "en"
) -> Report:
    """Measure and diagnose ``window``: the whole report."""
    node = measure(window, config.comm_phases, config.warmup_steps)
    verdicts = diagnose(node, config)
    on_node = node_findings(node, verdicts)
    status, reason_code = _status(node, verdicts, on_node)
    platform = node.platform
    return Report(
        source={**source, "seconds": round(window.seconds, 3),
                "snapshots": len(window.snapshots)},
        lang=lang,
        platform=_platform(platform.node, on_node, node.wall_time),
        gpus=_gpus(node),
        gpu_numa_nodes=platform.gpu_numa_nodes,
        numa=_numa(node, config),
        disks=node.disks,
        checkpoints=_checkpoints(platform, node.wall_time),
        nfs=platform.nfs_mounts,
        links=tuple(_link(link, platform) for link in node.links),
        nccl=node.nccl,
        verdicts=tuple(verdicts),
        goodput=node.goodput,
        ranks=node.ranks,
        status=status,
        reason=reason_text(reason_code, "en") if reason_code else "",
        reason_code=reason_code,
    )


def unmeasured_report(source: Source, reason: str, lang: str = "en", *,
                      code: str = "", values: tuple[tuple[str, str], ...] = ()) -> Report:
    """The report when the source could not be read at all: ``reason`` in English, and
    its ``messages.REASONS`` key and values when it has one."""
    return Report(source=source, lang=lang,
                  platform=_platform(PlatformMeasurements().node, (), None), reason=reason,
                  reason_code=code, reason_values=values)


def with_history(report: Report, history: History | None) -> Report:
    """``report`` with the node's run ledger; a node where nothing could be measured
    because no GPU and no job is there now, but whose ledger shows how its jobs ended
    lately, is ``ended`` (exit 0: the answer is that history)."""
    if history is None:
        return report
    status, reason, code = report.status, report.reason, report.reason_code
    if status == "unmeasured" and code == "no_gpu_no_job" and history.ended:
        status, reason, code = "ended", "", ""
    return dataclasses.replace(report, history=history, status=status, reason=reason,
                               reason_code=code)


def advice(verdict: Verdict, lang: str, history: History | None = None) -> str:
    """The next steps of critical findings (a spot reclaim: checkpoint now), the
    deciding finding's (with the network filesystem's when the data comes from
    one) — of a compute verdict, followed by the top operators of the latest profile
    of the job's latest run in ``history`` (the node's ledger), or without one the
    ``trainmon profile`` to run (``history.profile_step``) — then those of findings
    that need one wherever they stand (``messages.EXTRA_ADVICE``: an out-of-memory
    risk, the other risk findings)."""
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
        if finding is deciding and verdict.kind == "compute":
            texts.append(profile_step(history, verdict.job, lang))
    return " ".join(texts)


def _status(node: NodeMeasurements, verdicts: Sequence[Verdict],
            on_node: Sequence[Finding]) -> tuple[str, str]:
    """``bottleneck`` if any verdict needs action; ``risk`` if none does but a critical
    or warning finding stands; ``healthy`` if something was measured and nothing needs
    action; else ``unmeasured`` with the reason's key (``messages.REASONS``)."""
    if any(verdict.kind in ACTIONABLE_KINDS for verdict in verdicts):
        return "bottleneck", ""
    findings = [*on_node, *(f for verdict in verdicts for f in verdict.findings)]
    if any(finding.severity in SEVERITIES for finding in findings):
        return "risk", ""
    reporting = [verdict for verdict in verdicts if verdict.evidence.ranks]
    if any(verdict.kind == "compute" for verdict in verdicts):
        return "healthy", ""
    if reporting:
        return "unmeasured", "too_few_steps"
    if node.gpus:
        return "healthy", ""
    return "unmeasured", "no_gpu_no_job"


def _platform(platform: NodePlatform, on_node: Sequence[Finding],
              wall_time: float | None) -> Platform:
    at = platform.termination_timestamp
    seconds = max(0.0, at - wall_time) if at is not None and wall_time is not None else None
    return Platform(platform, seconds, tuple(on_node))


def _gpus(node: NodeMeasurements) -> tuple[GPU, ...]:
    rank_of_gpu = {rank.gpu: rank for rank in node.ranks if rank.gpu}
    jobs = process_jobs(node)
    gpus = []
    for gpu in node.gpus:
        rank = rank_of_gpu.get(gpu.gpu)
        gpus.append(GPU(
            gpu, rank.job if rank else "", rank.rank if rank else "",
            tuple(GPUProcess(process, jobs[process])
                  for process in node.processes if process.gpu == gpu.gpu),
        ))
    return tuple(gpus)


def _link(link: LinkState, platform: PlatformMeasurements) -> Link:
    ports = {(port.device, port.port): port.up for port in platform.rdma_ports}
    return Link(link, ports.get((link.device, link.port)) if link.kind == "infiniband"
                else None)


def _numa(node: NodeMeasurements, config: DiagnosisConfig) -> tuple[NumaBinding, ...]:
    jobs = {process: job for job, processes in numa_jobs(node).items()
            for process in processes}
    platform = node.platform
    bindings = []
    for process in platform.numa_processes:
        numa_node = platform.numa_node(process.gpu)
        far = (numa_node is not None and numa_node >= 0
               and process.local_ratio < config.numa_local_ratio_min)
        bindings.append(NumaBinding(process, jobs.get((process.gpu, process.pid), ""),
                                    numa_node, far))
    return tuple(bindings)


def _checkpoints(platform: PlatformMeasurements, wall_time: float) -> tuple[Checkpoint, ...]:
    checkpoints = []
    for state in platform.checkpoints:
        if (state.last_timestamp is None and state.checkpoints is None
                and not state.storage):
            continue  # a job that reports no checkpoint fields at all
        age = (None if state.last_timestamp is None
               else max(0.0, wall_time - state.last_timestamp))
        checkpoints.append(Checkpoint(state, age,
                                      state.storage[0] if state.storage else NO_STORAGE))
    return tuple(checkpoints)
