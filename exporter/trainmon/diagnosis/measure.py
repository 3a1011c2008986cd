"""What a window of snapshots says about the node: GPUs, ranks, disks, links, processes.

Every value is read from the metric contract (docs/metrics.md), never from a
collector's internals, so the same code serves the daemon and ``doctor``:

- GPUs: ``trainmon_gpu_utilization_ratio`` (mean over the window),
  ``trainmon_gpu_sawtooth_ratio`` (latest), ``trainmon_gpu_memory_used_bytes``
  and ``trainmon_gpu_memory_total_bytes`` (latest) and, on GPUs with GPM
  (Hopper and newer), the means of ``trainmon_gpu_sm_active_ratio``,
  ``trainmon_gpu_sm_occupancy_ratio``, ``trainmon_gpu_tensor_active_ratio``,
  ``trainmon_gpu_dram_active_ratio`` and ``trainmon_gpu_pipe_active_ratio{pipe}``;
  each MIG GPU instance (``trainmon_gpu_mig_*``) as a GPU of its own, ``0/mig1``,
  with the ranks and processes ``trainmon_gpu_mig_process_info`` puts on it;
- ranks: those whose run has not said it ended (no
  ``trainmon_training_rank_end_timestamp_seconds`` in the newest snapshot that
  holds the rank), with increases of
  ``trainmon_training_step_seconds_sum``/``_count``,
  ``trainmon_training_data_wait_seconds_total``,
  ``trainmon_training_phase_seconds_total{phase}`` and, for ranks that measure
  communication, ``trainmon_training_comm_seconds_total``,
  ``trainmon_training_comm_exposed_seconds_total`` and
  ``trainmon_training_comm_bytes_total``; the latest
  ``trainmon_training_last_step_timestamp_seconds``,
  ``trainmon_training_last_report_timestamp_seconds`` (when exported) and
  ``trainmon_training_rank_info{gpu,pid}``;
- disks: rates of ``trainmon_disk_io_time_seconds_total`` (busy ratio),
  ``trainmon_disk_read_bytes_total`` and ``trainmon_disk_written_bytes_total``;
- links: rates of ``trainmon_network_{receive,transmit}_bytes_total`` against
  ``trainmon_network_speed_bytes``, and of the InfiniBand port counters against
  ``trainmon_infiniband_rate_bytes``;
- processes: ``trainmon_gpu_process_info``, and the GPUs the kubelet allocated to a
  pod that no process holds (``trainmon_gpu_allocation_info``, without a pid); NCCL:
  ``trainmon_nccl_problem_info``;
- the platform signals (instance and spot state, checkpoints, NUMA, NFS
  mounts, RDMA port state): ``trainmon.diagnosis.platform_signals``.

A value a source does not provide is ``None``, never zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from trainmon.diagnosis.failslow import FAIL_SLOW_SAMPLES, FailSlow
from trainmon.diagnosis.platform_signals import (
    PLATFORM_SAMPLES,
    PlatformMeasurements,
    measure_platform,
)
from trainmon.diagnosis.samples import Labels, Window, labels_of

#: Every sample name ``measure`` reads (snapshots may keep only these).
MEASURED_SAMPLES = frozenset({
    "trainmon_gpu_utilization_ratio", "trainmon_gpu_info", "trainmon_gpu_up",
    "trainmon_gpu_sawtooth_ratio", "trainmon_gpu_memory_used_bytes",
    "trainmon_gpu_memory_total_bytes",
    "trainmon_gpu_sm_active_ratio", "trainmon_gpu_sm_occupancy_ratio",
    "trainmon_gpu_tensor_active_ratio", "trainmon_gpu_dram_active_ratio",
    "trainmon_gpu_pipe_active_ratio", "trainmon_gpu_sm_clock_max_hertz",
    "trainmon_gpu_mig_info", "trainmon_gpu_mig_process_info",
    "trainmon_gpu_mig_memory_used_bytes", "trainmon_gpu_mig_memory_total_bytes",
    "trainmon_gpu_mig_sm_active_ratio", "trainmon_gpu_mig_tensor_active_ratio",
    "trainmon_gpu_mig_dram_active_ratio",
    "trainmon_training_rank_info", "trainmon_training_last_step_timestamp_seconds",
    "trainmon_training_last_report_timestamp_seconds",
    "trainmon_training_step_seconds_count", "trainmon_training_step_seconds_sum",
    "trainmon_training_data_wait_seconds_total", "trainmon_training_phase_seconds_total",
    "trainmon_training_comm_seconds_total", "trainmon_training_comm_exposed_seconds_total",
    "trainmon_training_comm_bytes_total", "trainmon_training_rank_end_timestamp_seconds",
    "trainmon_disk_io_time_seconds_total", "trainmon_disk_read_bytes_total",
    "trainmon_disk_written_bytes_total",
    "trainmon_network_receive_bytes_total", "trainmon_network_transmit_bytes_total",
    "trainmon_network_speed_bytes",
    "trainmon_infiniband_receive_bytes_total", "trainmon_infiniband_transmit_bytes_total",
    "trainmon_infiniband_rate_bytes",
    "trainmon_gpu_process_info", "trainmon_nccl_problem_info",
    "trainmon_gpu_allocation_info",
    "trainmon_job_gpu_seconds_total", "trainmon_job_goodput_ratio",
    "trainmon_training_stall_info", "trainmon_training_stall_start_timestamp_seconds",
    "trainmon_training_group_comm_exposed_seconds_total",
    "trainmon_training_group_collective_seq",
    # a daemon's fail-slow changes, read back by ``doctor``
    "trainmon_diagnosis_finding_info", "trainmon_diagnosis_fail_slow_ratio",
    "trainmon_diagnosis_fail_slow_start_timestamp_seconds",
}) | PLATFORM_SAMPLES | FAIL_SLOW_SAMPLES


@dataclass(frozen=True)
class GPUState:
    gpu: str
    #: Mean duty cycle over the window (0-1).
    utilization: float | None
    sawtooth: float | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None = None
    #: GPM activity, means over the window (0-1); None on GPUs without GPM.
    #: SMs busy, resident warps over the SMs' maximum, time a tensor pipe was
    #: active, DRAM bandwidth used over its peak (docs/metrics.md, GPM activity).
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    #: ``(pipe, mean active ratio)`` of ``trainmon_gpu_pipe_active_ratio``, by pipe name.
    pipes: tuple[tuple[str, float], ...] = ()
    #: Product name (``trainmon_gpu_info{name}``) and maximum SM clock (Hz,
    #: ``trainmon_gpu_sm_clock_max_hertz``): its generation and clock class.
    model: str = ""
    max_clock_hertz: float | None = None

    @property
    def memory_used_ratio(self) -> float | None:
        """Memory used over memory total (0-1), when both are exported."""
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes

    @property
    def has_gpm(self) -> bool:
        """Whether the GPU exports GPM activity: its SM active ratio, on which the
        compute findings rest (a GPU lacking that metric counts as without GPM)."""
        return self.sm_active is not None


@dataclass(frozen=True)
class RankStall:
    """Where a stalled rank's training thread is, as its client reported it
    (``trainmon_training_stall_info``, docs/protocol.md "Stall reports")."""

    #: ``data_loader``, ``collective``, ``checkpoint``, ``phase`` or ``code``.
    where: str
    #: The innermost open phase ("" outside any).
    phase: str
    #: The collective in flight and its sequence number ("" where unknown).
    collective: str
    seq: str
    #: The innermost frame: ``dataset.py:42 __getitem__``.
    frame: str
    #: Unix time its last step ended.
    since: float | None
    #: The process group of the collective in flight ("" where unknown).
    group: str = ""


@dataclass(frozen=True)
class RankState:
    job: str
    rank: str
    gpu: str
    pid: str
    #: Increases over the window.
    steps: float
    step_seconds: float
    data_wait_seconds: float
    comm_seconds: float
    #: Whether the rank reports any of the configured comm phases at all.
    reports_comm: bool
    #: Data wait / step time in the earlier and the later half of the window.
    data_wait_earlier: float | None
    data_wait_recent: float | None
    last_step_timestamp: float | None
    #: When the rank's reporter last sent anything (its heartbeat), if exported.
    last_report_timestamp: float | None = None
    #: Communication measured inside the job (``Reporter.instrument``), increases over
    #: the window; None where the rank does not measure it. All seconds with a
    #: collective in flight, the part of them the rank waited for after its own
    #: compute (exposed), and the collectives' bytes.
    measured_comm_seconds: float | None = None
    exposed_comm_seconds: float | None = None
    comm_bytes: float | None = None
    #: Where it is while its client reports it stalled; None while it steps.
    stall: RankStall | None = None
    #: Work per step (step - data wait - communication waited for) in the earlier and
    #: the later half of the window; None where a half does not tell.
    work_earlier: float | None = None
    work_recent: float | None = None
    #: Per process group (``dp``, ``tp``, ``pp``...), the exposed seconds over the
    #: window (``trainmon_training_group_comm_exposed_seconds_total``).
    group_exposed: tuple[tuple[str, float], ...] = ()
    #: Per process group and its lowest rank, the sequence number of its last launch,
    #: latest (``trainmon_training_group_collective_seq``).
    group_seqs: tuple[tuple[str, str, int], ...] = ()

    @property
    def comm_wait_seconds(self) -> float | None:
        """The step time spent waiting for communication: the measured exposed
        communication where the rank measures it, else its comm phases, else None.
        Never both added: a measurement wins over the phase."""
        if self.exposed_comm_seconds is not None:
            return self.exposed_comm_seconds
        return self.comm_seconds if self.reports_comm else None


@dataclass(frozen=True)
class DiskState:
    device: str
    busy_ratio: float | None
    read_bytes_per_second: float | None
    write_bytes_per_second: float | None


@dataclass(frozen=True)
class LinkState:
    """A NIC (``port`` empty) or an InfiniBand/RoCE port."""

    kind: str  # "nic" or "infiniband"
    device: str
    port: str
    receive_bytes_per_second: float | None
    transmit_bytes_per_second: float | None
    rate_bytes_per_second: float | None

    @property
    def utilization(self) -> float | None:
        """The busier direction over the link rate (links are full duplex)."""
        rates = [r for r in (self.receive_bytes_per_second, self.transmit_bytes_per_second)
                 if r is not None]
        if not rates or not self.rate_bytes_per_second:
            return None
        return max(rates) / self.rate_bytes_per_second


@dataclass(frozen=True)
class GPUProcessState:
    gpu: str
    pid: str
    pod: str
    namespace: str
    container: str
    slurm_job: str
    pod_uid: str


@dataclass(frozen=True)
class NcclState:
    pid: str
    problem: str
    variable: str
    value: str


@dataclass(frozen=True)
class JobGoodput:
    """Where a job's GPU-seconds on this node went (the run ledger's goodput booking)."""

    job: str
    #: Productive over all its GPU-seconds, last 10 min (``trainmon_job_goodput_ratio``).
    ratio: float | None
    #: Its largest bucket but ``productive`` since the daemon started, and that bucket's
    #: share (0-1) of its GPU-seconds; None when it has none.
    largest_loss: str | None = None
    largest_loss_share: float | None = None


@dataclass(frozen=True)
class NodeMeasurements:
    window_seconds: float
    #: Unix time of the newest snapshot.
    wall_time: float
    gpus: tuple[GPUState, ...]
    ranks: tuple[RankState, ...]
    disks: tuple[DiskState, ...]
    links: tuple[LinkState, ...]
    processes: tuple[GPUProcessState, ...]
    nccl: tuple[NcclState, ...]
    platform: PlatformMeasurements = field(default_factory=PlatformMeasurements)
    goodput: tuple[JobGoodput, ...] = ()
    #: (job, rank, Unix time its run said it ended) of the ranks whose run ended, which
    #: ``ranks`` leaves out.
    ended_ranks: tuple[tuple[str, str, float], ...] = ()
    #: The fail-slow changes that hold: the daemon's detector's (``failslow``), or
    #: those a daemon exported, read back (``doctor --url``).
    fail_slow: tuple[FailSlow, ...] = ()


def measure(window: Window, comm_phases: Sequence[str] = ("comm",),
            warmup_steps: int = 0) -> NodeMeasurements:
    """Everything the rules and the report need, from one window.

    A MIG GPU instance is a GPU of its own here (``mig_gpu``): the ranks and
    processes on it (``trainmon_gpu_mig_process_info``) read its memory and GPM
    activity, not its parent GPU's."""
    instance_of_pid = _instance_of_pid(window)
    return NodeMeasurements(
        window_seconds=window.seconds,
        wall_time=window.last.wall,
        gpus=_gpus(window) + _mig_gpus(window),
        ranks=tuple(
            replace(rank, gpu=instance_of_pid.get(rank.pid, rank.gpu))
            for rank in _ranks(window, tuple(comm_phases), warmup_steps)),
        ended_ranks=tuple(sorted(
            (dict(labels).get("job", ""), dict(labels).get("rank", ""), ended)
            for labels, ended in window.latest(
                "trainmon_training_rank_end_timestamp_seconds").items())),
        disks=_disks(window),
        links=_links(window),
        processes=_with_allocations(window, tuple(
            replace(process, gpu=instance_of_pid.get(process.pid, process.gpu))
            for labels in window.latest("trainmon_gpu_process_info")
            for process in (GPUProcessState(*(dict(labels).get(key, "") for key in (
                "gpu", "pid", "pod", "namespace", "container", "slurm_job", "pod_uid"))),)
        )),
        nccl=tuple(
            NcclState(*(dict(labels).get(key, "") for key in ("pid", "problem", "variable",
                                                              "value")))
            for labels in window.latest("trainmon_nccl_problem_info")
        ),
        platform=measure_platform(window),
        goodput=_goodput(window),
        fail_slow=_exported_fail_slow(window),
    )


def _exported_fail_slow(window: Window) -> tuple[FailSlow, ...]:
    """The fail-slow changes a daemon exported (``trainmon_diagnosis_fail_slow_ratio``
    with the kind of its ``fail_slow`` finding and its start), newest snapshot."""
    kinds = {(names.get("job", ""), names.get("rank", "")): names.get("kind", "")
             for labels in window.latest("trainmon_diagnosis_finding_info")
             if (names := dict(labels)).get("finding") == "fail_slow"}
    starts = {(names.get("job", ""), names.get("rank", "")): value
              for labels, value in window.latest(
                  "trainmon_diagnosis_fail_slow_start_timestamp_seconds").items()
              for names in (dict(labels),)}
    changes = []
    for labels, ratio in window.latest("trainmon_diagnosis_fail_slow_ratio").items():
        names = dict(labels)
        key = (names.get("job", ""), names.get("rank", ""))
        if key in kinds:
            changes.append(FailSlow(
                job=key[0], rank=key[1], part=names.get("part", ""), kind=kinds[key],
                cause=names.get("cause", ""), ratio=ratio, start=starts.get(key, 0.0),
                before_seconds=0.0, after_seconds=0.0))
    return tuple(sorted(changes, key=lambda change: (change.job, change.rank)))


def _goodput(window: Window) -> tuple[JobGoodput, ...]:
    """Each job's goodput from the newest snapshot (the ledger exports both series)."""
    seconds: dict[str, dict[str, float]] = {}
    for labels, value in window.latest("trainmon_job_gpu_seconds_total").items():
        names = dict(labels)
        seconds.setdefault(names.get("job", ""), {})[names.get("bucket", "")] = value
    ratios = {dict(labels).get("job", ""): value
              for labels, value in window.latest("trainmon_job_goodput_ratio").items()}
    jobs = []
    for job in sorted((seconds.keys() | ratios.keys()) - {""}):
        buckets = seconds.get(job, {})
        total = sum(buckets.values())
        losses = {name: value for name, value in buckets.items()
                  if name != "productive" and value > 0}
        largest = max(losses, key=lambda name: (losses[name], name)) if losses else None
        jobs.append(JobGoodput(
            job=job, ratio=ratios.get(job), largest_loss=largest,
            largest_loss_share=losses[largest] / total if largest and total > 0 else None))
    return tuple(jobs)


def _gpus(window: Window) -> tuple[GPUState, ...]:
    indices = {dict(labels).get("gpu", "") for name in (
        "trainmon_gpu_utilization_ratio", "trainmon_gpu_info", "trainmon_gpu_up")
        for labels in window.label_sets(name)}
    models = {names.get("gpu", ""): names.get("name", "")
              for labels in window.latest("trainmon_gpu_info") for names in (dict(labels),)}
    states = []
    for gpu in sorted(indices - {""}, key=_numeric_first):
        key = labels_of({"gpu": gpu})
        states.append(GPUState(
            gpu=gpu,
            utilization=window.mean("trainmon_gpu_utilization_ratio", key),
            sawtooth=window.latest("trainmon_gpu_sawtooth_ratio").get(key),
            memory_used_bytes=window.latest("trainmon_gpu_memory_used_bytes").get(key),
            memory_total_bytes=window.latest("trainmon_gpu_memory_total_bytes").get(key),
            sm_active=window.mean("trainmon_gpu_sm_active_ratio", key),
            sm_occupancy=window.mean("trainmon_gpu_sm_occupancy_ratio", key),
            tensor_active=window.mean("trainmon_gpu_tensor_active_ratio", key),
            dram_active=window.mean("trainmon_gpu_dram_active_ratio", key),
            pipes=_pipes(window, gpu),
            model=models.get(gpu, ""),
            max_clock_hertz=window.latest("trainmon_gpu_sm_clock_max_hertz").get(key),
        ))
    return tuple(states)


def mig_gpu(gpu: str, gpu_instance_id: str) -> str:
    """The ``gpu`` a MIG GPU instance has in the diagnosis: ``0/mig1`` (GPU 0, instance 1)."""
    return f"{gpu}/mig{gpu_instance_id}"


def _with_allocations(window: Window, processes: tuple[GPUProcessState, ...]
                      ) -> tuple[GPUProcessState, ...]:
    """``processes``, then each GPU the kubelet allocated to a pod that no process holds
    (``trainmon_gpu_allocation_info``) as held by that pod, without a pid."""
    held = {process.gpu for process in processes}
    allocated = dict.fromkeys(
        GPUProcessState(names["gpu"], "", names["pod"], names.get("namespace", ""),
                        names.get("container", ""), "", "")
        for labels in window.latest("trainmon_gpu_allocation_info")
        for names in (dict(labels),)
        if names.get("gpu") and names.get("pod") and names["gpu"] not in held)
    return processes + tuple(allocated)


def _mig_gpus(window: Window) -> tuple[GPUState, ...]:
    """Each MIG GPU instance as a GPU (``trainmon_gpu_mig_*``): its memory and GPM
    activity; model and clock are its parent's (no driver utilization per instance)."""
    models = {names.get("gpu", ""): names.get("name", "")
              for labels in window.latest("trainmon_gpu_info") for names in (dict(labels),)}
    max_clocks = {dict(labels).get("gpu", ""): value for labels, value in
                  window.latest("trainmon_gpu_sm_clock_max_hertz").items()}
    states = []
    for labels in window.latest("trainmon_gpu_mig_info"):
        names = dict(labels)
        gpu, instance = names.get("gpu", ""), names.get("gpu_instance_id", "")
        key = labels_of({name: value for name, value in names.items() if name != "uuid"})
        states.append(GPUState(
            gpu=mig_gpu(gpu, instance),
            utilization=None,
            sawtooth=None,
            memory_used_bytes=window.latest("trainmon_gpu_mig_memory_used_bytes").get(key),
            memory_total_bytes=window.latest("trainmon_gpu_mig_memory_total_bytes").get(key),
            sm_active=window.mean("trainmon_gpu_mig_sm_active_ratio", key),
            tensor_active=window.mean("trainmon_gpu_mig_tensor_active_ratio", key),
            dram_active=window.mean("trainmon_gpu_mig_dram_active_ratio", key),
            model=models.get(gpu, ""),
            max_clock_hertz=max_clocks.get(gpu),
        ))
    return tuple(sorted(states, key=lambda state: state.gpu))


def _instance_of_pid(window: Window) -> dict[str, str]:
    """pid → the ``mig_gpu`` of the MIG instance it runs on (``…_mig_process_info``)."""
    return {
        names.get("pid", ""): mig_gpu(names.get("gpu", ""), names.get("gpu_instance_id", ""))
        for labels in window.latest("trainmon_gpu_mig_process_info")
        for names in (dict(labels),)
    }


def _pipes(window: Window, gpu: str) -> tuple[tuple[str, float], ...]:
    pipes = []
    for labels in window.label_sets("trainmon_gpu_pipe_active_ratio"):
        labels_dict = dict(labels)
        if labels_dict.get("gpu") != gpu or "pipe" not in labels_dict:
            continue
        value = window.mean("trainmon_gpu_pipe_active_ratio", labels)
        if value is not None:
            pipes.append((labels_dict["pipe"], value))
    return tuple(sorted(pipes))


def _ranks(window: Window, comm_phases: tuple[str, ...],
           warmup_steps: int) -> tuple[RankState, ...]:
    """Each rank's state over the window, its first ``warmup_steps`` steps left out (a
    first step carries the rendezvous, compilation and the first batch)."""
    info = {
        (labels_dict["job"], labels_dict["rank"]): labels_dict
        for labels in window.latest("trainmon_training_rank_info")
        if "job" in (labels_dict := dict(labels)) and "rank" in labels_dict
    }
    last_step = window.latest("trainmon_training_last_step_timestamp_seconds")
    last_report = window.latest("trainmon_training_last_report_timestamp_seconds")
    # by (job, rank): the rank's series carry more labels (its owner) than these two
    stall_since = {(names.get("job", ""), names.get("rank", "")): value
                   for labels, value in window.latest(
                       "trainmon_training_stall_start_timestamp_seconds").items()
                   for names in (dict(labels),)}
    stalls = {}
    for stall_labels in window.latest("trainmon_training_stall_info"):
        found = dict(stall_labels)
        rank_key = (found.get("job", ""), found.get("rank", ""))
        stalls[labels_of({"job": rank_key[0], "rank": rank_key[1]})] = RankStall(
            where=found.get("where", ""), phase=found.get("phase", ""),
            collective=found.get("collective", ""),
            seq=found.get("seq", ""), frame=found.get("frame", ""),
            since=stall_since.get(rank_key), group=found.get("group", ""))
    group_labels: dict[tuple[str, str], list[tuple[str, Labels]]] = {}
    for labels in window.label_sets("trainmon_training_group_comm_exposed_seconds_total"):
        found = dict(labels)
        group_labels.setdefault((found.get("job", ""), found.get("rank", "")), []).append(
            (found.get("group", ""), labels))
    seqs_by_rank: dict[tuple[str, str], list[tuple[str, str, int]]] = {}
    for seq_labels, value in window.latest("trainmon_training_group_collective_seq").items():
        found = dict(seq_labels)
        seqs_by_rank.setdefault((found.get("job", ""), found.get("rank", "")), []).append(
            (found.get("group", ""), found.get("root", ""), int(value)))
    ranks = []
    for labels in window.label_sets("trainmon_training_step_seconds_count"):
        if _ended(window, labels):
            continue
        labels_dict = dict(labels)
        job, rank = labels_dict.get("job", ""), labels_dict.get("rank", "")
        own = window.from_count("trainmon_training_step_seconds_count", labels, warmup_steps)
        halves = own.halves()
        phases = {phase: labels_of({**labels_dict, "phase": phase}) for phase in comm_phases}
        comm = [own.increase("trainmon_training_phase_seconds_total", key)
                for key in phases.values()]
        group_exposed = [
            (group, exposed) for group, key in group_labels.get((job, rank), ())
            if (exposed := own.increase("trainmon_training_group_comm_exposed_seconds_total",
                                        key)) is not None]
        extra = info.get((job, rank), {})
        ranks.append(RankState(
            job=job,
            rank=rank,
            gpu=extra.get("gpu", ""),
            pid=extra.get("pid", ""),
            steps=own.increase("trainmon_training_step_seconds_count", labels) or 0.0,
            step_seconds=own.increase("trainmon_training_step_seconds_sum", labels) or 0.0,
            data_wait_seconds=own.increase(
                "trainmon_training_data_wait_seconds_total", labels) or 0.0,
            comm_seconds=sum(value for value in comm if value is not None),
            reports_comm=any(
                key in window.latest("trainmon_training_phase_seconds_total")
                for key in phases.values()
            ),
            data_wait_earlier=_wait_ratio(halves[0], labels) if halves else None,
            data_wait_recent=_wait_ratio(halves[1], labels) if halves else None,
            work_earlier=_work(halves[0], labels, phases) if halves else None,
            work_recent=_work(halves[1], labels, phases) if halves else None,
            last_step_timestamp=last_step.get(labels),
            last_report_timestamp=last_report.get(labels),
            measured_comm_seconds=own.increase("trainmon_training_comm_seconds_total", labels),
            exposed_comm_seconds=own.increase(
                "trainmon_training_comm_exposed_seconds_total", labels),
            comm_bytes=own.increase("trainmon_training_comm_bytes_total", labels),
            stall=stalls.get(labels_of({"job": job, "rank": rank})),
            group_exposed=tuple(sorted(group_exposed)),
            group_seqs=tuple(sorted(seqs_by_rank.get((job, rank), ()))),
        ))
    ranks.sort(key=lambda state: (state.job, _numeric_first(state.rank)))
    return tuple(ranks)


def _ended(window: Window, labels: Labels) -> bool:
    """Whether the rank's run said it ended, as of the newest snapshot that holds it."""
    for snapshot in reversed(window.snapshots):
        if labels in snapshot.series("trainmon_training_step_seconds_count"):
            return labels in snapshot.series("trainmon_training_rank_end_timestamp_seconds")
    return False


def _work(window: Window, labels: Labels, phases: Mapping[str, Labels]) -> float | None:
    """Work per step over ``window``: step - data wait - the communication waited for
    (measured exposed, else the comm phases, as ``RankState.comm_wait_seconds``)."""
    steps = window.increase("trainmon_training_step_seconds_count", labels)
    step = window.increase("trainmon_training_step_seconds_sum", labels)
    if not steps or step is None:
        return None
    wait = window.increase("trainmon_training_data_wait_seconds_total", labels) or 0.0
    comm = window.increase("trainmon_training_comm_exposed_seconds_total", labels)
    if comm is None:
        comm = sum(value for key in phases.values() if (
            value := window.increase("trainmon_training_phase_seconds_total", key)) is not None)
    return max(0.0, step - wait - comm) / steps


def _wait_ratio(window: Window, labels: Labels) -> float | None:
    step = window.increase("trainmon_training_step_seconds_sum", labels)
    wait = window.increase("trainmon_training_data_wait_seconds_total", labels)
    if not step or wait is None:
        return None
    return min(1.0, wait / step)


def _disks(window: Window) -> tuple[DiskState, ...]:
    disks = []
    for labels in window.label_sets("trainmon_disk_io_time_seconds_total"):
        busy = window.rate("trainmon_disk_io_time_seconds_total", labels)
        disks.append(DiskState(
            device=dict(labels).get("device", ""),
            busy_ratio=None if busy is None else min(1.0, busy),
            read_bytes_per_second=window.rate("trainmon_disk_read_bytes_total", labels),
            write_bytes_per_second=window.rate("trainmon_disk_written_bytes_total", labels),
        ))
    return tuple(disks)


def _links(window: Window) -> tuple[LinkState, ...]:
    links = []
    speeds = window.latest("trainmon_network_speed_bytes")
    for labels in window.label_sets("trainmon_network_receive_bytes_total"):
        links.append(LinkState(
            kind="nic",
            device=dict(labels).get("device", ""),
            port="",
            receive_bytes_per_second=window.rate("trainmon_network_receive_bytes_total", labels),
            transmit_bytes_per_second=window.rate("trainmon_network_transmit_bytes_total", labels),
            rate_bytes_per_second=speeds.get(labels),
        ))
    rates = window.latest("trainmon_infiniband_rate_bytes")
    for labels in window.label_sets("trainmon_infiniband_receive_bytes_total"):
        links.append(LinkState(
            kind="infiniband",
            device=dict(labels).get("device", ""),
            port=dict(labels).get("port", ""),
            receive_bytes_per_second=window.rate(
                "trainmon_infiniband_receive_bytes_total", labels),
            transmit_bytes_per_second=window.rate(
                "trainmon_infiniband_transmit_bytes_total", labels),
            rate_bytes_per_second=rates.get(labels),
        ))
    return tuple(links)


def _numeric_first(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (1 << 62, text)
