"""Ledger collector: the run recorder's metrics and read routes, wired to the training store.

A derived collector (after ``diagnosis``). The recorder
(``trainmon.ledger.recorder``: its thread, the file, the end-of-run policy of
``trainmon.ledger.ending``) reads the training collector's store through the
ledger's read-only interface (``trainmon.ledger.feed``: the store's
``snapshot()`` and this node's ``TrainingCollector.storage_of``, which its
factory hands over). This collector is given the recorder, hands it the verdicts of each
evaluation (``observe()``: the ``trainmon_bottleneck`` family the diagnosis
evaluated; the fail-slow changes of ``trainmon_diagnosis_fail_slow_ratio``, their start
and their finding's kind: ``fail_slow_changes``) and exports what it reads:
``trainmon_training_run_changes_info``,
``trainmon_training_run_end_timestamp_seconds`` and the ledger's self-metrics.
``get_routes()`` declares the JSON read routes of ``trainmon.ledger.api``
(``GET /api/v1/runs``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from trainmon.attribution import ProcessAttributor
from trainmon.attribution.podresources import GpuAllocation
from trainmon.collectors.attribution import AttributionCollector, GPUProcessSource
from trainmon.collectors.gpu import GPUCollector
from trainmon.collectors.training import TrainingCollector
from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.core.routes import GetHandler
from trainmon.ledger.api import RunsAPI
from trainmon.ledger.config import LedgerConfig
from trainmon.ledger.goodput import BUCKETS
from trainmon.ledger.holding import GpuHolding, pod_holding, team_of
from trainmon.ledger.recorder import (
    GOODPUT_WINDOW_SECONDS,
    MAX_GOODPUT_JOBS,
    MAX_UNWRITTEN,
    RunRecorder,
)
from trainmon.ledger.summary import FailSlowChange
from trainmon.training.protocol import job_name

#: Longest value of the ``changed`` label.
MAX_CHANGED_LENGTH = 200
#: The diagnosis' mean tensor-pipe activity (GPM) of each job's GPUs.
TENSOR_FAMILY = "trainmon_diagnosis_tensor_active_ratio"
#: The diagnosis' fail-slow changes: magnitude, start, and the finding (its kind).
FAIL_SLOW_FAMILY = "trainmon_diagnosis_fail_slow_ratio"
FAIL_SLOW_START_FAMILY = "trainmon_diagnosis_fail_slow_start_timestamp_seconds"
FINDING_FAMILY = "trainmon_diagnosis_finding_info"


class LedgerCollector(Collector):
    """Records runs from the training store into the ledger; exports run changes."""

    name = "ledger"

    def __init__(self, recorder: RunRecorder) -> None:
        self.recorder = recorder
        self._api = RunsAPI(recorder.config.file)

    def start(self) -> None:
        self.recorder.start()

    def stop(self) -> None:
        self.recorder.stop()

    def tick(self) -> None:
        """One tick of the recorder now (its thread ticks every ``flush_seconds``)."""
        self.recorder.tick()

    def observe(self, families: Sequence[Metric]) -> None:
        """One evaluation of the diagnosis: its verdict per job, for the recorder to
        count toward each running run (``RunRecorder.count_verdicts``)."""
        current: dict[str, str] | None = None
        for family in families:
            if family.name == TENSOR_FAMILY:
                self.recorder.observe_tensor_activity({
                    sample.labels["job"]: sample.value for sample in family.samples
                    if "job" in sample.labels})
            if family.name != "trainmon_bottleneck":
                continue
            current = {} if current is None else current
            for sample in family.samples:
                job, kind = sample.labels.get("job"), sample.labels.get("kind")
                if sample.value == 1 and job is not None and kind is not None:
                    current[job] = kind
        changes = fail_slow_changes(families)
        if changes is not None:
            self.recorder.count_fail_slow(changes)
        if current is None:
            return  # no verdicts at all in this evaluation: it tells nothing
        self.recorder.count_verdicts(current)

    def collect(self) -> Iterable[Metric]:
        changes = GaugeMetricFamily(
            "trainmon_training_run_changes_info",
            "What changed from the job's previous run in the ledger: the sorted, "
            "comma-joined names of config keys, environment variables, data, versions.<name> "
            "and world_size that differ (empty for the first run); always 1.",
            labels=["job", "owner", "run", "changed"],
        )
        ends = GaugeMetricFamily(
            "trainmon_training_run_end_timestamp_seconds",
            "Unix time a run ended on this node, by the ledger's end reason: finished, "
            "crashed, preempted (what its ranks said), lost (a rank went silent), stalled "
            "(no step for stall_seconds; gone when steps resume); for an hour after the "
            "end, the latest 16 runs. goodput: the closed run's productive share of its "
            "GPU-seconds on this node as a percentage (62%), empty while unknown.",
            labels=["job", "owner", "run", "reason", "goodput"],
        )
        readings = self.recorder.readings()
        for job, owner, run_id, changed in readings.changes:
            changes.add_metric([job, owner, run_id, _truncate(changed)], 1.0)
        for end in readings.ends:
            share = "" if end.goodput is None else f"{end.goodput:.0%}"
            ends.add_metric([end.job, end.owner, end.run, end.reason, share], end.ended)
        up = GaugeMetricFamily(
            "trainmon_ledger_up",
            "1 while the run ledger file is open and its last write succeeded; 0 when it "
            "cannot be used (see /healthz: missing directory, read-only, foreign file, "
            "another daemon holding its writer lock).",
        )
        up.add_metric([], 1.0 if readings.up else 0.0)
        writes = _counter(
            "trainmon_ledger_writes_total",
            "Transactions the recorder committed to the run ledger (one per flush).",
            readings.writes)
        errors = CounterMetricFamily(
            "trainmon_ledger_write_errors_total",
            "Flushes to the run ledger that failed (the records stay in memory), by "
            "reason: disk_full, read_only, io_error, busy, corrupt, other.",
            labels=["reason"])
        for reason, count in readings.write_errors.items():
            errors.add_metric([reason], count)
        unwritten = GaugeMetricFamily(
            "trainmon_ledger_unwritten_runs",
            "Records of ended runs kept in memory because the run ledger cannot be "
            f"written (a full or read-only disk), at most {MAX_UNWRITTEN}; written, oldest "
            "first, once it can.")
        unwritten.add_metric([], readings.unwritten_runs)
        dropped_unwritten = _counter(
            "trainmon_ledger_dropped_unwritten_runs_total",
            f"Records of ended runs lost because more than {MAX_UNWRITTEN} waited for a "
            "run ledger that could not be written (the oldest go first).",
            readings.dropped_unwritten_runs)
        refused = _counter(
            "trainmon_ledger_refused_runs_total",
            "Runs not recorded because their (job, run, node) record in the ledger "
            "belongs to another writer identity (a job name and run id re-used).",
            readings.refused_runs)
        pruned = CounterMetricFamily(
            "trainmon_ledger_pruned_runs_total",
            "Run records deleted by retention, by rule: age (ended more than "
            "retention_days ago), owner_limit (beyond max_runs_per_owner of their "
            "owner), max_runs (beyond max_runs, from the owners with the most runs).",
            labels=["reason"])
        for reason, count in readings.pruned.items():
            pruned.add_metric([reason], count)
        gpu_seconds = CounterMetricFamily(
            "trainmon_job_gpu_seconds_total",
            "GPU-seconds the job's ranks on this node held their GPUs, by bucket of the "
            "goodput ledger (productive, data_wait, comm_exposed, checkpoint, stalled, "
            "startup, other, ...); the buckets of a job add up to its GPU-seconds. Since the "
            f"daemon started, the latest {MAX_GOODPUT_JOBS} jobs; owner: the writer identity "
            "the job's GPU-seconds are booked for (a job name taken by another owner starts "
            "again).",
            labels=["job", "owner", "bucket"])
        owners = readings.owners
        for job, seconds in readings.gpu_seconds.items():
            for bucket in BUCKETS:
                gpu_seconds.add_metric([job, owners.get(job, ""), bucket],
                                       seconds.get(bucket, 0.0))
        goodput = _gauge_by_job(
            "trainmon_job_goodput_ratio",
            "Productive GPU-seconds of the job's ranks on this node over all they held, "
            f"in the last {GOODPUT_WINDOW_SECONDS / 60:g} minutes (0-1).",
            readings.goodput, owners)
        evicted = _counter(
            "trainmon_ledger_goodput_evicted_jobs_total",
            "Jobs whose trainmon_job_gpu_seconds_total series were dropped to keep the "
            f"{MAX_GOODPUT_JOBS} jobs booked last (their runs' records keep their GPU-seconds).",
            readings.goodput_evicted_jobs)
        teams = GaugeMetricFamily(
            "trainmon_job_team_info",
            "The team of a job of trainmon_job_gpu_seconds_total: the Kubernetes namespace "
            "of its processes, else their Slurm account, else the user who runs them or "
            "owns its reports; always 1.",
            labels=["job", "owner", "team"])
        for job, team in readings.teams.items():
            if team:
                teams.add_metric([job, owners.get(job, ""), team], 1.0)
        tensor = _gauge_by_job(
            "trainmon_job_productive_tensor_active_ratio",
            "Share of the job's productive GPU time with a tensor-core pipe active (GPM): "
            "the mean tensor activity of its GPUs over the goodput window divided by its "
            "goodput ratio, at most 1; only for jobs on GPUs with GPM.",
            readings.productive_tensor_active, owners)
        refused_idle = _counter(
            "trainmon_ledger_refused_idle_gpu_seconds_total",
            "GPU-seconds of processes that hold a GPU and name a job of another user (or "
            "more jobs without reports than a user may book): not booked as idle_allocated.",
            readings.refused_idle_seconds)
        api = self._api.counts()
        api_refused = CounterMetricFamily(
            "trainmon_ledger_api_refused_requests_total",
            "Requests to GET /api/v1/runs refused, by reason: busy (MAX_CONCURRENT_REQUESTS "
            "being answered: 503), invalid_query (a bad since, limit or cursor: 400).",
            labels=["reason"])
        for reason, count in api.refused.items():
            api_refused.add_metric([reason], count)
        api_cut = CounterMetricFamily(
            "trainmon_ledger_api_cut_pages_total",
            "Pages of GET /api/v1/runs that held fewer records than asked for while more "
            "followed, by the limit that cut them: max_body_bytes (MAX_BODY_BYTES of JSON), "
            "max_limit (a limit above MAX_LIMIT asked for).",
            labels=["reason"])
        for reason, count in api.cut.items():
            api_cut.add_metric([reason], count)
        families: list[Metric] = [changes, ends, up, writes, errors, unwritten, dropped_unwritten,
                                  refused, pruned,
                                  gpu_seconds, goodput, evicted, teams, tensor, refused_idle,
                                  api_refused, api_cut]
        if readings.stored_runs is not None:
            stored = GaugeMetricFamily(
                "trainmon_ledger_runs", "Run records in the node's run ledger.")
            stored.add_metric([], readings.stored_runs)
            families.append(stored)
        config = self.recorder.config
        if config.price_per_gpu_hour is not None:
            price = GaugeMetricFamily(
                "trainmon_ledger_price_per_gpu_hour",
                "Configured price of one GPU hour (collectors.ledger.price_per_gpu_hour), "
                "in the currency of the label; for cost per million samples.",
                labels=["currency"],
            )
            price.add_metric([config.currency], config.price_per_gpu_hour)
            families.append(price)
        return families

    def health(self) -> Mapping[str, object]:
        return self.recorder.health()

    def get_routes(self) -> Mapping[str, GetHandler]:
        """``GET /api/v1/runs`` and ``GET /api/v1/runs/<run>`` (``trainmon.ledger.api``)."""
        return self._api.routes()


def fail_slow_changes(families: Sequence[Metric]) -> list[FailSlowChange] | None:
    """The fail-slow changes the diagnosis' families name (``FAIL_SLOW_FAMILY`` with the
    start and the ``fail_slow`` finding's kind of the same job, owner and rank); None
    when the families hold no ``FAIL_SLOW_FAMILY`` (no evaluation: it tells nothing)."""
    ratios: dict[tuple[str, ...], float] = {}
    starts: dict[tuple[str, str, str], float] = {}
    kinds: dict[tuple[str, str, str], str] = {}
    present = False
    for family in families:
        if family.name == FAIL_SLOW_FAMILY:
            present = True
            for sample in family.samples:
                labels = sample.labels
                ratios[tuple(labels.get(name, "") for name in (
                    "job", "owner", "rank", "part", "cause"))] = sample.value
        elif family.name == FAIL_SLOW_START_FAMILY:
            for sample in family.samples:
                labels = sample.labels
                starts[(labels.get("job", ""), labels.get("owner", ""),
                        labels.get("rank", ""))] = sample.value
        elif family.name == FINDING_FAMILY:
            for sample in family.samples:
                labels = sample.labels
                if labels.get("finding") == "fail_slow" and sample.value == 1:
                    kinds[(labels.get("job", ""), labels.get("owner", ""),
                           labels.get("rank", ""))] = labels.get("kind", "")
    if not present:
        return None
    changes = []
    for (job, owner, rank, part, cause), ratio in ratios.items():
        if job:
            changes.append(FailSlowChange(
                job=job, owner=owner, rank=rank, part=part,
                kind=kinds.get((job, owner, rank), ""), cause=cause, ratio=ratio,
                start=starts.get((job, owner, rank), 0.0)))
    return changes


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_CHANGED_LENGTH else text[:MAX_CHANGED_LENGTH - 1] + "…"


class ProcessHoldings:
    """The GPUs' holdings (``trainmon.ledger.holding``): NVML's compute processes, each
    with its user (the owner of ``<proc>/<pid>``), the job its environment names
    (``trainmon.training.protocol.job_name``) and its team (its pod's namespace, Slurm
    account or user). A process whose environment cannot be read names no job. With
    ``allocations`` (the attribution collector's, from the kubelet's pod-resources API),
    each GPU allocated to a pod is held by it too (``trainmon.ledger.holding.pod_holding``)."""

    def __init__(self, processes: GPUProcessSource, attributor: ProcessAttributor,
                 proc_root: Path,
                 allocations: Callable[[], Sequence[GpuAllocation]] | None = None) -> None:
        self._processes = processes
        self._attributor = attributor
        self._proc = proc_root
        self._allocations = allocations

    def __call__(self) -> list[GpuHolding]:
        holdings = []
        known: dict[int, tuple[int | None, str | None, str]] = {}
        for gpu, processes in sorted(self._processes().items()):
            for process in processes:
                pid = int(process.pid)
                if pid not in known:
                    known[pid] = self._who(pid)
                uid, job, team = known[pid]
                holdings.append(GpuHolding(gpu=gpu, pid=pid, uid=uid, job=job, team=team))
        for allocation in self._allocations() if self._allocations is not None else ():
            if allocation.gpu.isdigit() and allocation.pod:
                holdings.append(pod_holding(int(allocation.gpu), allocation.namespace,
                                            allocation.pod))
        return holdings

    def follow(self, other: ProcessHoldings) -> None:
        """Read ``other``'s process lists, attributor and allocations from now on (a
        reload rebuilt the GPU collector or attribution, ``trainmon.reload``)."""
        self._processes, self._attributor, self._allocations = (
            other._processes, other._attributor, other._allocations)

    def _who(self, pid: int) -> tuple[int | None, str | None, str]:
        try:
            uid: int | None = os.stat(self._proc / str(pid)).st_uid
        except OSError:
            uid = None  # gone
        who = self._attributor.attribute(pid)
        job = None if who.environ is None else job_name(who.environ)
        return uid, job, team_of(who.namespace, who.environ, uid)


def _holdings(wiring: Wiring) -> ProcessHoldings | None:
    """The GPUs' holdings read from the GPU collector and attribution; None without GPUs."""
    if "gpu" not in wiring.built:
        return None
    gpu = wiring.collector("gpu", GPUCollector)
    attribution = wiring.built.get("attribution")
    known = attribution if isinstance(attribution, AttributionCollector) else None
    attributor = known.attributor if known else ProcessAttributor(wiring.proc_root)
    return ProcessHoldings(gpu.processes, attributor, wiring.proc_root,
                           known.allocations if known else None)


def _build(config: LedgerConfig, wiring: Wiring) -> Collector:
    training = wiring.collector("training", TrainingCollector)
    return LedgerCollector(RunRecorder(config, training.store, training.storage_of,
                                       holdings=_holdings(wiring)))


def _rewire(collector: Collector, wiring: Wiring) -> Callable[[], None] | None:
    """A reload rebuilt the GPU collector or attribution: the kept recorder (its open
    ledger, its runs) books with the new ones. None when the training store is another
    or the GPUs came or went (the recorder was built with holdings or without)."""
    training = wiring.collector("training", TrainingCollector)
    recorder = collector.recorder if isinstance(collector, LedgerCollector) else None
    if recorder is None or recorder.training is not training.store:
        return None
    current, new = recorder.holdings, _holdings(wiring)
    if not isinstance(current, ProcessHoldings) or new is None:
        return None
    return lambda: current.follow(new)


#: Derived, last: records the diagnosis' verdicts with each run; its open ledger
#: survives a configuration reload (trainmon.reload).
ENTRY = CollectorEntry("ledger", LedgerConfig, _build, derived=True, requires=("training",),
                       survives_reload=True, rewire=_rewire)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    """A counter family of one series without labels."""
    family = CounterMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


def _gauge_by_job(name: str, documentation: str, values: Mapping[str, float],
                  owners: Mapping[str, str]) -> GaugeMetricFamily:
    """A gauge family with one series per job, labelled with the job's owner."""
    family = GaugeMetricFamily(name, documentation, labels=["job", "owner"])
    for job, value in values.items():
        family.add_metric([job, owners.get(job, "")], value)
    return family
