"""The verdict: which of compute, communication, storage or scheduling holds a job back.

Pure functions of ``NodeMeasurements`` and ``DiagnosisConfig``
(docs/diagnosis.md explains every threshold). Per job, the evidence is:

- ``data_wait_ratio``: data wait / step time of the *worst* rank — in
  synchronous training every rank waits for the slowest loader at the next
  collective, so one starved rank holds back all;
- ``comm_ratio``: the communication waited for / step time of the rank that
  waits *least*. Per rank the wait is its **measured exposed communication**
  (``comm_exposed_seconds``, ``Reporter.instrument``) where it measures it,
  else its comm phase (``RankState.comm_wait_seconds``; measured wins, the two
  are never added, ``comm_source`` says which the job's ranks use); ranks with
  neither are left out. In synchronous training the last rank to reach each
  collective waits only for the transfer, the others also for that rank: the
  least wait is the network's own cost, so a straggler's peers are not taken
  for a slow network — with a measured exposed wait and with a hand-timed
  ``phase("comm")`` alike. The recording rule
  ``job:trainmon_training_comm:ratio_rate10m`` behind
  ``TrainmonCommunicationBound`` takes the same minimum over the job's ranks on
  every node, the daemon over the node's ranks. Communication overlapped with
  compute costs no step time and is not counted; the overlapped share and the
  effective bandwidth (collective bytes / seconds in flight) are kept as evidence;
- ``straggler_ratio``: the largest per-step *work* (step − data wait − comm
  wait, the same measured-or-phase choice) of a rank over the median work of
  the job's ranks (itself included, as the
  recording rule ``job_rank:trainmon_training_straggler:ratio_rate10m`` behind
  the alert and the dashboard computes it); work excludes the time a
  fast rank spends waiting for a slow one inside the collective, which is why
  stragglers are visible even though synchronised step times are equal. A rank
  that neither measures communication nor reports a comm phase has that wait
  hidden in its step, so its work is its whole step time (equal in
  synchronised jobs: no false straggler; unequal in independent ones);
- ``gpu_utilization_ratio``: mean utilization of the job's GPUs (the ``gpu``
  of its ranks, and GPUs its processes hold), plus the count of idle ones.
  NVML counts a GPU running NCCL kernels as busy, so measured exposed
  communication outranks it (rule 6 comes before the compute verdict);
- on GPUs with GPM (Hopper and newer): ``sm_active_ratio``,
  ``sm_occupancy_ratio``, ``tensor_active_ratio``, ``dram_active_ratio``
  (means over the job's GPUs that report them) and ``pipe_active`` (per pipe);
  these tell a GPU that computes from one that merely runs kernels. A busy GPU
  whose SMs are mostly idle while the job waits for communication is running
  NCCL kernels: the communication finding carries the SM activity as evidence;
- ``memory_used_ratio``: the largest memory used / total of the job's GPUs,
  and ``memory_full_gpus``, those within ``memory_headroom_ratio`` of full.

Rules, in order; the first that fires is the verdict, every rule that fires is
kept as a finding:

0. scheduling ``hung_rank``: a rank's client reports its steps stopped
   (``trainmon_training_stall_info``: no step for 10 typical steps, at least 10 s).
   The rank named is the one that holds the others (``hung_rank_finding``): a
   stalled rank that is *not* waiting in a collective while others are (or the
   only ones stalled: in its loader, a checkpoint, a phase, its own code), else a
   rank whose reporter went silent while the others wait (``gone``), else none on
   this node (every stalled rank here waits in a collective: the one that holds
   them is on another node; the cross-node recording rule names it);
1. scheduling ``stalled``: a rank without a step for ``stall_seconds`` whose
   reporter is still alive (``trainmon_training_last_report_timestamp_seconds``
   within ``ALIVE_SECONDS``, when exported — else until the rank's TTL);
2. none ``insufficient_data``: fewer than ``min_steps`` steps in the window;
3. storage ``data_wait``: ``data_wait_ratio`` ≥ threshold;
4. storage ``sawtooth_data_wait``: a GPU sawtooth ≥ ``sawtooth_ratio`` and a
   rising data wait (later half above earlier half) that reached
   ``sawtooth_data_wait_ratio``;
5. scheduling ``straggler``: ``straggler_ratio`` ≥ ``straggler_factor``;
6. communication ``comm_exposed`` (a rank measures its exposed communication)
   or ``comm_phase`` (the comm phases only): ``comm_ratio`` ≥ threshold;
7. communication ``link_saturated``: the job neither measures communication nor
   reports a comm phase, and a NIC or InfiniBand port ran at ≥
   ``link_utilization_ratio`` of its rate;
8. scheduling ``idle_gpus``: a GPU of the job is idle while it steps;
9. compute, when nothing above fired: ``host_bound`` (GPUs below
   ``busy_utilization_ratio`` with nothing to wait for); else, without GPM
   series, ``gpu_bound`` (GPUs busy or unknown: the verdict rests on
   utilization alone); else, from the GPM activity, every one that holds, in
   this order: ``launch_bound`` (SM active below ``sm_active_low_ratio``:
   small kernels, launch or host overhead), ``memory_bound`` (DRAM active at
   or above ``dram_active_ceiling_ratio``), ``tensor_idle`` (tensor pipes
   active below ``tensor_idle_ratio``: no mixed precision) — or, when none
   does, ``gpu_efficient``, the healthy case;
10. compute ``oom_risk``, beside whatever verdict: a GPU of the job with less
    than ``memory_headroom_ratio`` of its memory free (never the deciding
    finding: it is a risk, not what holds the job back now).

After the verdict's findings come the risk findings of ``risks`` (spot
reclaim, checkpoint age and storage, NUMA, NCCL over sockets), critical before
warning; they never decide the kind. A storage finding names the NFS/CFS mount
the data comes from when one reads (``risks.with_storage_source``).

A GPU process belongs to a job when a rank reports its PID, else when a rank
reports its GPU (a rank in a container reports the PID of its own namespace,
NVML the host's). The others form pseudo-jobs named
``pod:<namespace>/<pod>``, ``slurm:<id>`` or ``pid:<pid>``: scheduling
``idle_held`` when every GPU they hold is idle, else none ``no_telemetry``. A GPU the
kubelet allocated to a pod that runs no process on it is held by that pod (no pid).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from trainmon import contract
from trainmon.diagnosis import risks
from trainmon.diagnosis.finding import SEVERITIES, Finding
from trainmon.diagnosis.measure import (
    GPUProcessState,
    GPUState,
    LinkState,
    NcclState,
    NodeMeasurements,
    RankState,
)
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.training.stalls import (
    COLLECTIVE,
    GONE,
    SILENT_SECONDS,
    holding_rank,
    missing_rank,
)

KINDS = ("compute", "communication", "storage", "scheduling", "none")
#: A reporter that sent anything this recently is alive (it sends about every
#: second): its rank can be stalled; a silent one has finished or died.
ALIVE_SECONDS = SILENT_SECONDS
#: A rank silent this long while the job's other ranks ended after its last report was
#: lost first (its reporter sends every second or faster).
LOST_SILENT_SECONDS = 5.0
#: Verdicts that name a bottleneck worth acting on (``doctor`` exits 1).
ACTIONABLE_KINDS = ("communication", "storage", "scheduling")


@dataclass(frozen=True)
class Evidence:
    """The numbers of one job; ``None`` where the sources do not tell."""

    ranks: int = 0
    steps: float = 0.0
    step_seconds: float | None = None
    data_wait_ratio: float | None = None
    worst_data_wait_rank: str = ""
    comm_ratio: float | None = None
    #: What ``comm_ratio`` and the work per step rest on: ``measured`` (every
    #: stepping rank measures its exposed communication), ``phase`` (none does:
    #: the comm phases), ``mixed`` (some do: the wait and the work of each rank
    #: from its own evidence); empty without stepping ranks.
    comm_source: str = ""
    #: Communication overlapped with compute (measured − exposed) / step time of
    #: the median measuring rank.
    comm_overlapped_ratio: float | None = None
    #: Median over the measuring ranks of collective bytes / seconds in flight.
    comm_bytes_per_second: float | None = None
    straggler_ratio: float | None = None
    straggler_rank: str = ""
    #: Whether the straggler led in each half of the window too (True where the halves
    #: do not tell): one long step (an evaluation, a save reported by one rank a
    #: moment before the others) is no straggler.
    straggler_steady: bool = True
    #: The process group (parallelism dimension) the rank that waits least waits in
    #: most (``dp``, ``tp``...; "" where the ranks do not report groups).
    comm_group: str = ""
    #: Its wait for its neighbouring pipeline stages / its step (``pp`` exposed), on
    #: the pipeline rank that waits least; None without pipeline groups.
    pipeline_bubble_ratio: float | None = None
    gpu_utilization_ratio: float | None = None
    gpus: tuple[str, ...] = ()
    idle_gpus: tuple[str, ...] = ()
    sawtooth_ratio: float | None = None
    stalled_ranks: tuple[str, ...] = ()
    seconds_since_last_step: float | None = None
    busiest_link: str = ""
    busiest_link_utilization: float | None = None
    #: GPM activity of the job's GPUs (means over those with GPM, 0-1); None
    #: where no GPU of the job has GPM. ``gpm_gpus`` are the GPUs reporting it.
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    #: ``(pipe, mean active ratio)`` over the job's GPUs with GPM.
    pipe_active: tuple[tuple[str, float], ...] = ()
    gpm_gpus: tuple[str, ...] = ()
    #: The largest memory used / total of the job's GPUs, and the GPUs within
    #: ``memory_headroom_ratio`` of full.
    memory_used_ratio: float | None = None
    memory_full_gpus: tuple[str, ...] = ()
    #: The NFS/CFS mount the data comes from, when a storage finding fired and a
    #: network filesystem reads (the busiest): mount point, ``server:export``, read
    #: bytes per second and mean round trip per READ (seconds).
    storage_mountpoint: str = ""
    storage_source: str = ""
    storage_read_bytes_per_second: float | None = None
    storage_read_rtt_seconds: float | None = None


@dataclass(frozen=True)
class Verdict:
    job: str
    kind: str
    #: Every rule that fired, the deciding one first.
    findings: tuple[Finding, ...]
    evidence: Evidence
    #: NCCL problems of the job's processes.
    nccl: tuple[NcclState, ...] = ()


def diagnose(node: NodeMeasurements, config: DiagnosisConfig) -> list[Verdict]:
    """One verdict per reporting job, then one per unclaimed GPU process group."""
    gpus = {gpu.gpu: gpu for gpu in node.gpus}
    busiest = _busiest_link(node.links)
    jobs: dict[str, list[RankState]] = {}
    for rank in node.ranks:
        jobs.setdefault(rank.job, []).append(rank)
    held: dict[str, set[str]] = {}
    unclaimed: dict[str, list[GPUProcessState]] = {}
    for process, job in process_jobs(node).items():
        if job in jobs:
            held.setdefault(job, set()).add(process.gpu)
        else:
            unclaimed.setdefault(job, []).append(process)
    numa_processes = numa_jobs(node)
    mount = risks.busiest_nfs_mount(node)
    reclaim = risks.reclaim_finding(node, [*sorted(jobs), *sorted(unclaimed)])
    on_node = [reclaim] if reclaim else []
    verdicts = []
    for job, ranks in sorted(jobs.items()):
        job_gpus = sorted({r.gpu for r in ranks if r.gpu} | held.get(job, set()))
        evidence = _evidence(ranks, [gpus[g] for g in job_gpus if g in gpus], busiest,
                             node.wall_time, config)
        hung = hung_rank_finding(ranks, node.wall_time, {
            rank: ended for ended_job, rank, ended in node.ended_ranks if ended_job == job})
        findings = risks.with_storage_source(
            [*([hung] if hung else []), *_job_findings(ranks, evidence, config)], mount)
        if mount is not None and any(f.code in risks.STORAGE_CODES for f in findings):
            evidence = replace(
                evidence, storage_mountpoint=mount.mountpoint, storage_source=mount.source,
                storage_read_bytes_per_second=mount.read_bytes_per_second,
                storage_read_rtt_seconds=mount.read_rtt_seconds)
        sockets = risks.nccl_socket_finding(job, len(ranks), evidence.comm_ratio, node, config)
        findings = _with_risks(findings, [
            *on_node, *fail_slow_findings(job, node),
            *filter(None, [risks.mixed_gpus_finding([gpus[g] for g in job_gpus if g in gpus])]),
            *risks.checkpoint_findings(job, node, config),
            *risks.numa_findings(numa_processes.get(job, set()), node, config),
            *([sockets] if sockets else [])])
        pids = {rank.pid for rank in ranks if rank.pid}
        verdicts.append(Verdict(job, findings[0].kind, tuple(findings), evidence,
                                tuple(n for n in node.nccl if n.pid in pids)))
    for name, processes in sorted(unclaimed.items()):
        verdict = _holder_verdict(name, processes, gpus, node.nccl, config)
        verdicts.append(replace(verdict, findings=tuple(_with_risks(verdict.findings, [
            *on_node, *risks.numa_findings(numa_processes.get(name, set()), node, config)]))))
    return verdicts


def fail_slow_findings(job: str, node: NodeMeasurements) -> list[Finding]:
    """``fail_slow`` (warning) for each change of the job that holds (``failslow``): the
    rank that degraded ("" for the job), the part, its cause, by how much and since when."""
    return [Finding(change.kind, "fail_slow", {
        "rank": change.rank, "part": change.part, "cause": change.cause,
        "ratio": change.ratio, "start": change.start,
        **({"group": change.group} if change.group else {}),
        **({"before": change.before_seconds, "after": change.after_seconds}
           if change.after_seconds else {}),
        **({"evidence_before": change.evidence_before, "evidence_now": change.evidence_now}
           if change.evidence_now is not None and change.evidence_before is not None
           else {}),
    }, severity="warning") for change in node.fail_slow if change.job == job]


def hung_rank_finding(ranks: Sequence[RankState], wall_time: float,
                      ended: Mapping[str, float] | None = None) -> Finding | None:
    """The ``hung_rank`` finding of a job's ranks on the node (rule 0), None while none
    of them reports a stall and none was lost. ``rank``: the rank that holds the others
    ("" when it is on another node); ``where``: where it is (``gone`` for a silent
    reporter, ``elsewhere`` when it is on another node); ``waiting``: the ranks waiting
    in a collective, with its name and sequence number; ``seconds``: since the earliest
    stalled rank's last step. ``ended``: the job's ranks whose run ended (rank -> Unix
    time), which ``ranks`` leaves out: a rank silent while the others' runs ended after
    its last report was lost first, and the others broke on it (``_lost_rank``)."""
    # a reporter silent for ALIVE_SECONDS is gone, whatever it said last
    gone = [rank for rank in ranks if rank.last_report_timestamp is not None
            and wall_time - rank.last_report_timestamp > ALIVE_SECONDS]
    stalled = [rank for rank in ranks if rank.stall is not None and rank not in gone]
    if not stalled and not any(rank.stall is not None for rank in gone):
        return _lost_rank(ranks, wall_time, ended or {})
    stalls = {rank.rank: rank.stall for rank in stalled if rank.stall is not None}
    waiting = [rank for rank in stalled if stalls[rank.rank].where == COLLECTIVE]
    waits = [(rank.rank, stall.group, _root(rank, stall.group), int(stall.seq))
             for rank in waiting if (stall := rank.stall) is not None
             and stall.group and stall.seq.isdigit()]
    launched = {rank.rank: {(group, root): seq for group, root, seq in rank.group_seqs}
                for rank in ranks if rank.group_seqs}
    culprit, where = holding_rank([(rank, stall.where) for rank, stall in stalls.items()],
                                  [rank.rank for rank in gone], missing_rank(waits, launched))
    held = stalls.get(culprit) if culprit in stalls else None
    frame, phase = ("", "") if held is None else (held.frame, held.phase)
    since = [rank.stall.since for rank in stalled
             if rank.stall is not None and rank.stall.since is not None]
    collective = next((rank.stall for rank in waiting if rank.stall is not None), None)
    return Finding("scheduling", "hung_rank", {
        "rank": culprit,
        "where": where,
        "frame": frame,
        "phase": phase,
        "waiting": ",".join(rank.rank for rank in waiting),
        "collective": "" if collective is None else collective.collective,
        "group": "" if collective is None else collective.group,
        "seq": "" if collective is None else collective.seq,
        "seconds": max(wall_time - min(since), 0.0) if since else 0.0,
        # where each rank is, for doctor's lines: rank|where|collective|seq|frame|seconds;…
        "ranks": ";".join([*(_rank_where(rank, wall_time) for rank in stalled),
                           *(_gone_where(rank, wall_time) for rank in gone)]),
    })


def _lost_rank(ranks: Sequence[RankState], wall_time: float,
               ended: Mapping[str, float]) -> Finding | None:
    """``hung_rank`` for a rank lost without a word (killed, out of memory) whose peers
    then broke on it: on gloo a peer's collective fails at once ("connection closed by
    peer") and its run ends crashed; on NCCL the peers wait, and their stalls name it.
    The lost rank went silent for ``LOST_SILENT_SECONDS`` without its run ending, and
    every other rank of the job on the node ended after its last report."""
    if not ended:
        return None
    silent = [rank for rank in ranks if rank.last_report_timestamp is not None
              and wall_time - rank.last_report_timestamp > LOST_SILENT_SECONDS
              and rank.last_report_timestamp < min(ended.values())]
    if len(silent) != 1 or len(silent) != len(ranks):
        return None
    lost = silent[0]
    return Finding("scheduling", "hung_rank", {
        "rank": lost.rank, "where": GONE, "frame": "", "phase": "", "waiting": "",
        "collective": "", "group": "", "seq": "",
        "seconds": wall_time - (lost.last_report_timestamp or wall_time),
        "ranks": _gone_where(lost, wall_time),
    })


def _root(rank: RankState, group: str) -> str:
    """The lowest rank of ``rank``'s group named ``group`` ("" when unknown)."""
    return next((root for name, root, _ in rank.group_seqs if name == group), "")


def _rank_where(rank: RankState, wall_time: float) -> str:
    """One rank of ``hung_rank``'s ``ranks``: ``0|collective|all_reduce|311|graph.py:825
    _engine_run_backward|47`` (seconds since its last step)."""
    stall = rank.stall
    assert stall is not None
    seconds = 0.0 if stall.since is None else max(wall_time - stall.since, 0.0)
    collective = f"{stall.group}:{stall.collective}" if stall.group else stall.collective
    fields = (rank.rank, stall.where, collective, stall.seq, stall.frame)
    return "|".join(field.replace("|", "/").replace(";", ",") for field in fields) + \
        f"|{seconds:.0f}"


def _gone_where(rank: RankState, wall_time: float) -> str:
    """A gone rank of ``hung_rank``'s ``ranks``: ``1|gone||||35``, silent for 35 s."""
    return f"{rank.rank}|gone||||{wall_time - (rank.last_report_timestamp or wall_time):.0f}"


def _with_risks(findings: Sequence[Finding], risk_findings: Sequence[Finding]) -> list[Finding]:
    """The verdict's findings in rule order, then the risk findings, critical before
    warning (in the order given within each: a spot reclaim first)."""
    ranked = sorted(risk_findings, key=lambda f: SEVERITIES.index(f.severity))
    return [*findings, *ranked]


def node_findings(node: NodeMeasurements, verdicts: Sequence[Verdict]) -> list[Finding]:
    """The findings about the node itself, whatever runs on it (a spot reclaim)."""
    reclaim = risks.reclaim_finding(node, [verdict.job for verdict in verdicts])
    return [reclaim] if reclaim else []


def numa_jobs(node: NodeMeasurements) -> dict[str, set[tuple[str, str]]]:
    """The ``(gpu, pid)`` of every process with a NUMA ratio, by job: as GPU
    processes are joined (``process_jobs``), else by the PID or GPU a rank
    reports, else the ``pid:`` pseudo-job."""
    by_process = {(p.gpu, p.pid): job for p, job in process_jobs(node).items()}
    job_of_pid = {rank.pid: rank.job for rank in node.ranks if rank.pid}
    job_of_gpu = {rank.gpu: rank.job for rank in node.ranks if rank.gpu}
    jobs: dict[str, set[tuple[str, str]]] = {}
    for process in node.platform.numa_processes:
        key = (process.gpu, process.pid)
        job = (by_process.get(key) or job_of_pid.get(process.pid)
               or job_of_gpu.get(process.gpu) or f"pid:{process.pid}")
        jobs.setdefault(job, set()).add(key)
    return jobs


def process_jobs(node: NodeMeasurements) -> dict[GPUProcessState, str]:
    """The job of every GPU process: by reported PID, else reported GPU, else a pseudo-job."""
    job_of_pid = {rank.pid: rank.job for rank in node.ranks if rank.pid}
    job_of_gpu = {rank.gpu: rank.job for rank in node.ranks if rank.gpu}
    return {
        process: job_of_pid.get(process.pid) or job_of_gpu.get(process.gpu)
        or holder_name(process)
        for process in node.processes
    }


def holder_name(process: GPUProcessState) -> str:
    """The pseudo-job of a GPU process that reports no steps."""
    if process.pod:
        return f"pod:{process.namespace}/{process.pod}"
    if process.pod_uid:
        return f"pod:{process.pod_uid}"
    if process.slurm_job:
        return f"slurm:{process.slurm_job}"
    return f"pid:{process.pid}"


def _evidence(
    ranks: Sequence[RankState],
    gpus: Sequence[GPUState],
    busiest: LinkState | None,
    wall_time: float,
    config: DiagnosisConfig,
) -> Evidence:
    stepping = [rank for rank in ranks if rank.step_seconds > 0 and rank.steps > 0]
    waits = {rank.rank: rank.data_wait_seconds / rank.step_seconds for rank in stepping}
    worst = max(waits, key=lambda name: waits[name]) if waits else ""
    measuring = [rank for rank in stepping if rank.exposed_comm_seconds is not None]
    # Each rank's own wait (measured exposed, else its comm phase); ranks with
    # neither do not tell, and are left out rather than counted as 0.
    # A pipeline stage's waits for its neighbours (the pp group) are bubbles as far as
    # the neighbours' compute explains them, the rest is transfer: communication.
    bubble = _bubbles(stepping)
    comm_waits = [(_comm_wait(rank, bubble) or 0.0) / rank.step_seconds for rank in stepping
                  if rank.comm_wait_seconds is not None]
    bubbles = [bubble[rank.rank] / rank.step_seconds for rank in stepping
               if rank.rank in bubble]
    least_waiting = min((rank for rank in stepping if rank.comm_wait_seconds is not None),
                        key=lambda rank: (_comm_wait(rank, bubble) or 0.0) / rank.step_seconds,
                        default=None)
    overlapped = [
        max(0.0, rank.measured_comm_seconds - (rank.exposed_comm_seconds or 0.0))
        / rank.step_seconds
        for rank in measuring if rank.measured_comm_seconds is not None
    ]
    bandwidths = [
        rank.comm_bytes / rank.measured_comm_seconds for rank in stepping
        if rank.comm_bytes is not None and rank.measured_comm_seconds
    ]
    # Only ranks with ``min_steps`` steps of their own in the window are compared:
    # a rank that has just (re)started has only its slow first steps to show.
    compared = [rank for rank in stepping if rank.steps >= config.min_steps]
    straggler_rank, straggler = _straggler(compared)
    mean_utilization, idle_gpus = _gpu_usage(gpus, config)
    activity = _gpm_activity(gpus)
    memory = {gpu.gpu: ratio for gpu in gpus if (ratio := gpu.memory_used_ratio) is not None}
    sawtooths = [gpu.sawtooth for gpu in gpus if gpu.sawtooth is not None]
    last_steps = {rank.rank: rank.last_step_timestamp for rank in ranks
                  if rank.last_step_timestamp is not None}
    newest = max(last_steps.values(), default=None)
    return Evidence(
        ranks=len(ranks),
        steps=sum(rank.steps for rank in ranks),
        step_seconds=_median(r.step_seconds / r.steps for r in stepping)
        if stepping else None,
        data_wait_ratio=min(1.0, waits[worst]) if waits else None,
        worst_data_wait_rank=worst,
        comm_ratio=min(1.0, min(comm_waits)) if comm_waits else None,
        comm_source=_comm_source(len(measuring), len(stepping)),
        comm_overlapped_ratio=min(1.0, _median(overlapped)) if overlapped else None,
        comm_bytes_per_second=_median(bandwidths) if bandwidths else None,
        straggler_ratio=straggler,
        straggler_rank=straggler_rank,
        straggler_steady=_steady_straggler(compared, straggler_rank, config.straggler_factor),
        comm_group=_busiest_group(least_waiting, bubble),
        pipeline_bubble_ratio=min(1.0, min(bubbles)) if bubbles else None,
        gpu_utilization_ratio=mean_utilization,
        gpus=tuple(gpu.gpu for gpu in gpus),
        idle_gpus=idle_gpus,
        sawtooth_ratio=max(sawtooths, default=None),
        stalled_ranks=tuple(
            rank.rank for rank in ranks
            if rank.last_step_timestamp is not None
            and wall_time - rank.last_step_timestamp > config.stall_seconds
            and (rank.last_report_timestamp is None
                 or wall_time - rank.last_report_timestamp <= ALIVE_SECONDS)
        ),
        seconds_since_last_step=None if newest is None else max(0.0, wall_time - newest),
        busiest_link=_link_name(busiest) if busiest else "",
        busiest_link_utilization=busiest.utilization if busiest else None,
        sm_active_ratio=activity.sm_active,
        sm_occupancy_ratio=activity.sm_occupancy,
        tensor_active_ratio=activity.tensor_active,
        dram_active_ratio=activity.dram_active,
        pipe_active=activity.pipes,
        gpm_gpus=activity.gpus,
        memory_used_ratio=max(memory.values(), default=None),
        memory_full_gpus=tuple(gpu for gpu, ratio in memory.items()
                               if ratio >= 1.0 - config.memory_headroom_ratio),
    )


@dataclass(frozen=True)
class _Activity:
    """GPM activity means over the GPUs that report it (``gpus``)."""

    gpus: tuple[str, ...] = ()
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    pipes: tuple[tuple[str, float], ...] = ()


def _gpm_activity(gpus: Sequence[GPUState]) -> _Activity:
    """Means of the GPM ratios over the GPUs with GPM. A GPU that exports the
    tensor pipes but not the tensor total counts its busiest tensor pipe."""
    with_gpm = [gpu for gpu in gpus if gpu.has_gpm]
    if not with_gpm:
        return _Activity()

    def mean(values: Sequence[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return sum(known) / len(known) if known else None

    def tensor(gpu: GPUState) -> float | None:
        if gpu.tensor_active is not None:
            return gpu.tensor_active
        return max((value for pipe, value in gpu.pipes if pipe.startswith("tensor")),
                   default=None)

    pipes: dict[str, list[float]] = {}
    for gpu in with_gpm:
        for pipe, value in gpu.pipes:
            pipes.setdefault(pipe, []).append(value)
    return _Activity(
        gpus=tuple(gpu.gpu for gpu in with_gpm),
        sm_active=mean([gpu.sm_active for gpu in with_gpm]),
        sm_occupancy=mean([gpu.sm_occupancy for gpu in with_gpm]),
        tensor_active=mean([tensor(gpu) for gpu in with_gpm]),
        dram_active=mean([gpu.dram_active for gpu in with_gpm]),
        pipes=tuple((pipe, sum(values) / len(values)) for pipe, values in sorted(pipes.items())),
    )


def _comm_source(measuring: int, stepping: int) -> str:
    if not stepping:
        return ""
    if measuring == stepping:
        return "measured"
    return "mixed" if measuring else "phase"


def _median(values: Iterable[float]) -> float:
    """The median of a non-empty ``values``: ``statistics.median``'s result (the mean of
    the middle two of an even count), without importing ``statistics`` and the
    ``decimal`` and ``fractions`` modules it loads into every daemon."""
    data = sorted(values)
    middle = len(data) // 2
    if len(data) % 2:
        return data[middle]
    return (data[middle - 1] + data[middle]) / 2


def _steady_straggler(ranks: Sequence[RankState], slowest: str, factor: float) -> bool:
    """Whether ``slowest`` also did ``factor`` times the median work per step in each
    half of the window, where every rank's halves tell."""
    if not slowest or len(ranks) < 2:
        return True
    for half in ("work_earlier", "work_recent"):
        work = {rank.rank: getattr(rank, half) for rank in ranks}
        if None in work.values():  # this half does not tell
            continue
        median = _median(work.values())
        if median > 0 and work.get(slowest, 0.0) < factor * median:
            return False
    return True


def _bubbles(ranks: Sequence[RankState]) -> dict[str, float]:
    """Per pipeline rank, the seconds of its waits for its neighbouring stages (the
    ``pp`` group's exposed time) that the other stages' compute explains: at most the
    most work per step (step - data wait - exposed communication) of any other rank,
    per step. A stage cannot wait for a neighbour's compute longer than that compute
    takes; what it waits beyond it, the activations and gradients were on the wire."""
    work = {rank.rank: max(0.0, rank.step_seconds - rank.data_wait_seconds
                           - (rank.comm_wait_seconds or 0.0)) / rank.steps
            for rank in ranks if rank.steps > 0}
    bubbles = {}
    for rank in ranks:
        waited = dict(rank.group_exposed).get(contract.PIPELINE_GROUP)
        if waited is None or rank.steps <= 0:
            continue
        others = max((seconds for name, seconds in work.items() if name != rank.rank),
                     default=0.0)
        bubbles[rank.rank] = min(waited, others * rank.steps)
    return bubbles


def _comm_wait(rank: RankState, bubbles: Mapping[str, float]) -> float | None:
    """The rank's wait for communication, its pipeline bubbles left out."""
    wait = rank.comm_wait_seconds
    if wait is None:
        return None
    return max(0.0, wait - bubbles.get(rank.rank, 0.0))


def _busiest_group(rank: RankState | None, bubbles: Mapping[str, float]) -> str:
    """The group ``rank`` waits in most, pipeline bubbles left out ("" when unknown)."""
    if rank is None:
        return ""
    waits = [(seconds - (bubbles.get(rank.rank, 0.0)
                         if group == contract.PIPELINE_GROUP else 0.0), group)
             for group, seconds in rank.group_exposed]
    waits = [(seconds, group) for seconds, group in waits if seconds > 0]
    return max(waits)[1] if waits else ""


def _straggler(ranks: Sequence[RankState]) -> tuple[str, float | None]:
    """The rank with the largest work per step, and its work over the median of all ranks'.

    Work is step − data wait − the communication waited for (measured exposed
    communication, else the comm phase: ``RankState.comm_wait_seconds``), or
    the whole step where neither is known. The median includes the slowest
    rank (the median of an even count is the mean of the middle two, as in
    ``statistics.median`` and PromQL's ``quantile(0.5, …)``), so the ratio is the one
    ``contract.STRAGGLER_RATIO_SERIES`` records.
    """
    work = {}
    for rank in ranks:
        comm = rank.comm_wait_seconds
        seconds = (rank.step_seconds if comm is None
                   else max(0.0, rank.step_seconds - rank.data_wait_seconds - comm))
        work[rank.rank] = seconds / rank.steps
    if len(work) < 2:
        return "", None
    slowest = max(work, key=lambda name: work[name])
    median = _median(work.values())
    if median <= 0:
        return "", None
    return slowest, work[slowest] / median


def _job_findings(
    ranks: Sequence[RankState], evidence: Evidence, config: DiagnosisConfig
) -> list[Finding]:
    """The bottleneck rules in order (1-9), then the memory headroom (10)."""
    findings = _bottleneck_findings(ranks, evidence, config)
    if evidence.memory_full_gpus:
        findings.append(Finding("compute", "oom_risk", {
            "gpus": ",".join(evidence.memory_full_gpus),
            "ratio": evidence.memory_used_ratio or 0.0,
            "threshold": config.memory_headroom_ratio}))
    return findings


def _bottleneck_findings(
    ranks: Sequence[RankState], evidence: Evidence, config: DiagnosisConfig
) -> list[Finding]:
    findings: list[Finding] = []
    if evidence.stalled_ranks:
        findings.append(Finding("scheduling", "stalled", {
            "ranks": ",".join(evidence.stalled_ranks),
            "seconds": evidence.seconds_since_last_step or 0.0,
            "threshold": config.stall_seconds,
        }))
    if evidence.steps < config.min_steps or evidence.step_seconds is None:
        findings.append(Finding("none", "insufficient_data", {
            "steps": evidence.steps, "threshold": float(config.min_steps)}))
        return findings
    wait = evidence.data_wait_ratio or 0.0
    if wait >= config.data_wait_ratio:
        findings.append(Finding("storage", "data_wait", {
            "ratio": wait, "rank": evidence.worst_data_wait_rank,
            "threshold": config.data_wait_ratio}))
    if _sawtooth_with_rising_wait(ranks, evidence, config):
        findings.append(Finding("storage", "sawtooth_data_wait", {
            "sawtooth": evidence.sawtooth_ratio or 0.0, "ratio": wait,
            "threshold": config.sawtooth_ratio}))
    if (evidence.straggler_ratio is not None
            and evidence.straggler_ratio >= config.straggler_factor
            and evidence.straggler_steady):
        findings.append(Finding("scheduling", "straggler", {
            "rank": evidence.straggler_rank, "factor": evidence.straggler_ratio,
            "threshold": config.straggler_factor}))
    bubble = evidence.pipeline_bubble_ratio
    if bubble is not None and bubble >= config.pipeline_bubble_ratio:
        findings.append(Finding("scheduling", "pipeline_bubble", {
            "ratio": bubble, "threshold": config.pipeline_bubble_ratio}))
    comm = evidence.comm_ratio or 0.0
    if comm >= config.comm_ratio:
        code = "comm_phase" if evidence.comm_source == "phase" else "comm_exposed"
        values: dict[str, float | str] = {"ratio": comm, "threshold": config.comm_ratio,
                                          "group": evidence.comm_group}
        if _busy_without_compute(evidence, config):
            # NVML's "busy" GPUs whose SMs are mostly idle run NCCL kernels: more
            # evidence for communication, none for compute.
            values["utilization"] = evidence.gpu_utilization_ratio or 0.0
            values["sm_active"] = evidence.sm_active_ratio or 0.0
        findings.append(Finding("communication", code, values))
    link = evidence.busiest_link_utilization
    if (not any(rank.comm_wait_seconds is not None for rank in ranks) and link is not None
            and link >= config.link_utilization_ratio):
        findings.append(Finding("communication", "link_saturated", {
            "link": evidence.busiest_link, "ratio": link,
            "threshold": config.link_utilization_ratio}))
    if evidence.idle_gpus:
        findings.append(Finding("scheduling", "idle_gpus", {
            "gpus": ",".join(evidence.idle_gpus), "threshold": config.idle_utilization_ratio}))
    if findings:
        return findings
    utilization = evidence.gpu_utilization_ratio
    if utilization is not None and utilization < config.busy_utilization_ratio:
        findings.append(Finding("compute", "host_bound", {
            "utilization": utilization, "ratio": wait, "comm": comm,
            "threshold": config.busy_utilization_ratio}))
    elif evidence.sm_active_ratio is None:
        compute: dict[str, float | str] = {"ratio": wait, "comm": comm}
        if utilization is not None:
            compute["utilization"] = utilization
        findings.append(Finding("compute", "gpu_bound", compute))
    else:
        findings += _efficiency_findings(evidence, config)
    return findings


def _efficiency_findings(evidence: Evidence, config: DiagnosisConfig) -> list[Finding]:
    """How well busy GPUs with GPM compute: launch-bound, memory-bound, tensor
    cores idle (each that holds, in this order), else efficient."""
    sm_active = evidence.sm_active_ratio or 0.0
    tensor = evidence.tensor_active_ratio
    dram = evidence.dram_active_ratio
    values: dict[str, float | str] = {
        "utilization": evidence.gpu_utilization_ratio or 0.0,
        "sm_active": sm_active,
        "tensor_active": tensor if tensor is not None else 0.0,
        "dram_active": dram if dram is not None else 0.0,
        "gpus": ",".join(evidence.gpm_gpus),
    }
    if evidence.sm_occupancy_ratio is not None:
        values["sm_occupancy"] = evidence.sm_occupancy_ratio
    findings = []
    if sm_active < config.sm_active_low_ratio:
        findings.append(Finding("compute", "launch_bound", {
            **values, "threshold": config.sm_active_low_ratio}))
    if dram is not None and dram >= config.dram_active_ceiling_ratio:
        findings.append(Finding("compute", "memory_bound", {
            **values, "threshold": config.dram_active_ceiling_ratio}))
    if tensor is not None and tensor < config.tensor_idle_ratio:
        findings.append(Finding("compute", "tensor_idle", {
            **values, "threshold": config.tensor_idle_ratio}))
    return findings or [Finding("compute", "gpu_efficient", values)]


def _busy_without_compute(evidence: Evidence, config: DiagnosisConfig) -> bool:
    """GPUs busy by NVML utilization whose SMs (GPM) are mostly idle."""
    return (evidence.sm_active_ratio is not None
            and evidence.gpu_utilization_ratio is not None
            and evidence.gpu_utilization_ratio >= config.busy_utilization_ratio
            and evidence.sm_active_ratio < config.sm_active_low_ratio)


def _sawtooth_with_rising_wait(
    ranks: Sequence[RankState], evidence: Evidence, config: DiagnosisConfig
) -> bool:
    if evidence.sawtooth_ratio is None or evidence.sawtooth_ratio < config.sawtooth_ratio:
        return False
    return any(
        rank.data_wait_recent is not None
        and rank.data_wait_earlier is not None
        and rank.data_wait_recent > rank.data_wait_earlier
        and rank.data_wait_recent >= config.sawtooth_data_wait_ratio
        for rank in ranks
    )


def _gpu_usage(
    gpus: Sequence[GPUState], config: DiagnosisConfig
) -> tuple[float | None, tuple[str, ...]]:
    """Mean utilization ratio (0–1) of the ``gpus`` that report one (None when none
    does), and the GPUs below ``config.idle_utilization_ratio``."""
    utilizations = [gpu.utilization for gpu in gpus if gpu.utilization is not None]
    mean = sum(utilizations) / len(utilizations) if utilizations else None
    idle = tuple(gpu.gpu for gpu in gpus if gpu.utilization is not None
                 and gpu.utilization < config.idle_utilization_ratio)
    return mean, idle


def _holder_verdict(
    name: str,
    processes: Sequence[GPUProcessState],
    gpus: dict[str, GPUState],
    nccl: Sequence[NcclState],
    config: DiagnosisConfig,
) -> Verdict:
    held = [gpus[gpu] for gpu in sorted({p.gpu for p in processes}) if gpu in gpus]
    mean_utilization, idle = _gpu_usage(held, config)
    evidence = Evidence(
        gpus=tuple(gpu.gpu for gpu in held),
        idle_gpus=idle,
        gpu_utilization_ratio=mean_utilization,
    )
    pids = ",".join(sorted({p.pid for p in processes if p.pid},  # none: only allocated
                           key=lambda pid: (len(pid), pid)))
    if held and len(idle) == len(held):
        finding = Finding("scheduling", "idle_held", {
            "gpus": ",".join(idle), "pids": pids, "threshold": config.idle_utilization_ratio})
    else:
        finding = Finding("none", "no_telemetry", {"pids": pids})
    pid_set = {p.pid for p in processes}
    return Verdict(name, finding.kind, (finding,), evidence,
                   tuple(n for n in nccl if n.pid in pid_set))


def _busiest_link(links: Sequence[LinkState]) -> LinkState | None:
    measured = [link for link in links if link.utilization is not None]
    return max(measured, key=lambda link: link.utilization or 0.0, default=None)


def _link_name(link: LinkState) -> str:
    return f"{link.device}:{link.port}" if link.port else link.device
