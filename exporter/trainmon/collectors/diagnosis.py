"""Diagnosis collector: the 算 通 存 调 verdict per job, with its evidence.

The verdicts run on the daemon's clock, not on scrapes: the collector's
``evaluation_seconds`` is ``diagnosis.window_seconds / EVALUATIONS_PER_WINDOW``
(3 s by default), and the registry's evaluation loop
(``trainmon.core.registry``) collects the other collectors (GPU, network,
InfiniBand, disk, training, attribution, and the platform, NUMA and NFS
sources where present) that often, whether or not anything scrapes, and hands
their families over through ``Collector.observe``. There the collector
snapshots the samples the diagnosis reads (so the verdict rests on exactly the
samples exported), keeps the snapshots of the last ``diagnosis.window_seconds``
and runs ``trainmon.diagnosis`` over that window; ``collect()`` exports the
latest verdicts, which is what every scrape gets (a scrape never evaluates).
So the first scrape after a start that had a few intervals of data already
has a verdict, and the run ledger, after this collector in the same
evaluation, records verdicts on a node that nothing scrapes. Observations
closer together than ``evaluation_seconds`` (an explicit
``CollectorRegistry.evaluate()``) keep the last verdicts: at most 20
evaluations, and snapshots, per window.
Exports, per job (a training job's name, or ``pod:…``/``slurm:…``/``pid:…``
for GPU processes that report no steps) and its ``owner`` (the writer identity
whose training series the verdict read, their ``owner`` label; empty for the
pseudo-jobs, which no writer reports: docs/security.md, "Owners across nodes"):

- ``trainmon_bottleneck{job,owner,kind}``: 1 for the verdict, 0 for the other kinds
  (``compute``, ``communication``, ``storage``, ``scheduling``, ``none``);
- ``trainmon_diagnosis_finding_info{job,owner,kind,finding,rank}``: every rule that
  fired; ``rank`` is the rank it names (the straggler, the worst data wait),
  empty for the others. The risk findings of ``trainmon.diagnosis.risks``
  (``spot_reclaim``, ``checkpoint_overdue``, ``checkpoint_missing``,
  ``checkpoint_local_disk``, ``numa_far``, ``nccl_over_sockets``) are exported
  the same way beside the verdict's; their severity is fixed per finding (docs/diagnosis.md);
- evidence gauges ``trainmon_diagnosis_{data_wait,comm,gpu_utilization,
  straggler}_ratio{job,owner}``, ``..._idle_gpus``, ``..._stalled_ranks``,
  ``..._step_seconds``, the GPM activity of the job's GPUs
  ``trainmon_diagnosis_{sm_active,sm_occupancy,tensor_active,dram_active}_ratio``
  (GPUs with GPM only) and ``trainmon_diagnosis_memory_used_ratio`` (omitted
  where the sources do not tell);
- ``trainmon_diagnosis_window_seconds``: the span of the evidence.

A source that fails contributes nothing to that snapshot; the registry
reports it through ``trainmon_collector_success``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from trainmon.core.collector import Collector
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import GaugeMetricFamily, Metric
from trainmon.diagnosis import KINDS, ScrapedSamples, Verdict, Window, diagnose, measure
from trainmon.diagnosis.failslow import MIN_OBSERVATIONS, FailSlowDetector
from trainmon.diagnosis.measure import MEASURED_SAMPLES
from trainmon.diagnosis.thresholds import DiagnosisConfig

#: Evaluations (and snapshots) per window: the registry evaluates every
#: window / 20; observations closer together keep the last verdicts.
EVALUATIONS_PER_WINDOW = 20
#: Snapshots kept at most (bounds memory even with a clock that jumps).
MAX_SNAPSHOTS = EVALUATIONS_PER_WINDOW + 2


class DiagnosisCollector(Collector):
    """Runs the verdict rules over a sliding window of the other collectors' samples.

    Register it after the collectors it reads: it sees the families the
    registry collected before it in the same evaluation.
    """

    name = "diagnosis"

    def __init__(
        self,
        config: DiagnosisConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self._snapshots: deque[ScrapedSamples] = deque(maxlen=MAX_SNAPSHOTS)
        self._interval = config.window_seconds / EVALUATIONS_PER_WINDOW
        self.evaluation_seconds = self._interval
        # the test window holds at least one observation more than a change needs
        test_seconds = max(config.fail_slow_test_seconds,
                           (MIN_OBSERVATIONS + 1) * self._interval)
        self._fail_slow = FailSlowDetector(
            ratio=config.fail_slow_ratio, test_seconds=test_seconds,
            reference_seconds=max(config.fail_slow_reference_seconds, test_seconds),
            warmup_steps=config.warmup_steps, comm_phases=config.comm_phases)
        self._verdicts: list[Verdict] = []
        #: job -> the owner of the training series its verdict read (jobs of _verdicts).
        self._owners: dict[str, str] = {}
        self._window_seconds = 0.0

    def health(self) -> dict[str, object]:
        return {
            "snapshots": len(self._snapshots),
            "verdicts": {verdict.job: verdict.kind for verdict in self._verdicts},
        }

    def observe(self, families: Sequence[Metric]) -> None:
        """Snapshot ``families`` and evaluate the window again, unless the last
        evaluation is younger than ``evaluation_seconds``."""
        now = self._clock()
        if self._snapshots and now - self._snapshots[-1].at < self._interval:
            return
        snapshot = ScrapedSamples.from_families(
            families, now, self._wall_clock(), MEASURED_SAMPLES)
        self._snapshots.append(snapshot)
        horizon = now - self._config.window_seconds
        while len(self._snapshots) > 1 and self._snapshots[1].at <= horizon:
            self._snapshots.popleft()
        window = Window(list(self._snapshots))
        measured = replace(
            measure(window, self._config.comm_phases, self._config.warmup_steps),
            fail_slow=self._fail_slow.update(snapshot))
        self._verdicts = diagnose(measured, self._config)
        self._owners = _job_owners(families, self._owners, {v.job for v in self._verdicts})
        self._window_seconds = window.seconds

    def collect(self) -> Iterable[Metric]:
        """The families of the latest verdicts (none before the first evaluation)."""
        if not self._snapshots:
            return []
        return verdict_families(self._verdicts, self._window_seconds, self._owners)


def _job_owners(families: Sequence[Metric], before: Mapping[str, str],
                jobs: set[str]) -> dict[str, str]:
    """job -> owner of each of ``jobs``: the ``owner`` label of its training series in
    ``families`` (one owner per job on a node: the training store's), else the one it had
    at an earlier evaluation (its ranks gone, still in the window)."""
    owners: dict[str, str] = {}
    for family in families:
        if not family.name.startswith("trainmon_training_"):
            continue
        for sample in family.samples:
            job, owner = sample.labels.get("job"), sample.labels.get("owner")
            if job in jobs and owner is not None:
                owners.setdefault(job, owner)
    return {job: owners.get(job, before.get(job, "")) for job in jobs}


def verdict_families(verdicts: Sequence[Verdict], window_seconds: float,
                     owners: Mapping[str, str]) -> list[Metric]:
    """The exported families of a list of verdicts, each job labelled with its owner
    (``owners``; empty where none is known)."""
    bottleneck = GaugeMetricFamily(
        "trainmon_bottleneck",
        "1 for the kind that holds the job back now (compute, communication, storage, "
        "scheduling, none), 0 for the others; docs/diagnosis.md has the rules.",
        labels=["job", "owner", "kind"],
    )
    findings = GaugeMetricFamily(
        "trainmon_diagnosis_finding_info",
        "A diagnosis rule that fired for the job (the verdict is the first in rule order), "
        "with the rank it names (straggler, data_wait; empty for the others); always 1.",
        labels=["job", "owner", "kind", "finding", "rank"],
    )
    gauges = {
        name: GaugeMetricFamily(name, help_text, labels=["job", "owner"])
        for name, help_text in (
            ("trainmon_diagnosis_data_wait_ratio",
             "Data wait / step time of the job's worst rank over the window."),
            ("trainmon_diagnosis_comm_ratio",
             "Communication waited for / step time of the rank that waits least (its "
             "measured exposed communication, else its comm phase)."),
            ("trainmon_diagnosis_gpu_utilization_ratio",
             "Mean utilization of the job's GPUs over the window."),
            ("trainmon_diagnosis_straggler_ratio",
             "Largest per-step work (step - data wait - exposed comm, else comm phase) "
             "of a rank over the median of the job's ranks."),
            ("trainmon_diagnosis_idle_gpus",
             "GPUs of the job below the idle utilization threshold."),
            ("trainmon_diagnosis_stalled_ranks",
             "Ranks of the job without a step for diagnosis.stall_seconds."),
            ("trainmon_diagnosis_step_seconds",
             "Median step duration of the job's ranks over the window."),
            ("trainmon_diagnosis_sm_active_ratio",
             "Mean SM active ratio (GPM) of the job's GPUs over the window; only GPUs with "
             "GPM (Hopper and newer)."),
            ("trainmon_diagnosis_sm_occupancy_ratio",
             "Mean SM occupancy ratio (GPM) of the job's GPUs over the window."),
            ("trainmon_diagnosis_tensor_active_ratio",
             "Mean tensor pipe active ratio (GPM) of the job's GPUs over the window."),
            ("trainmon_diagnosis_dram_active_ratio",
             "Mean DRAM active ratio (GPM) of the job's GPUs over the window."),
            ("trainmon_diagnosis_memory_used_ratio",
             "Largest memory used / memory total of the job's GPUs."),
        )
    }
    for verdict in verdicts:
        job = [verdict.job, owners.get(verdict.job, "")]
        for kind in KINDS:
            bottleneck.add_metric([*job, kind], 1.0 if kind == verdict.kind else 0.0)
        for finding in verdict.findings:
            rank = finding.values.get("rank", "")
            findings.add_metric(
                [*job, finding.kind, finding.code, rank if isinstance(rank, str) else ""],
                1.0)
        evidence = verdict.evidence
        values = {
            "trainmon_diagnosis_data_wait_ratio": evidence.data_wait_ratio,
            "trainmon_diagnosis_comm_ratio": evidence.comm_ratio,
            "trainmon_diagnosis_gpu_utilization_ratio": evidence.gpu_utilization_ratio,
            "trainmon_diagnosis_straggler_ratio": evidence.straggler_ratio,
            "trainmon_diagnosis_idle_gpus":
                float(len(evidence.idle_gpus)) if evidence.gpus else None,
            "trainmon_diagnosis_stalled_ranks":
                float(len(evidence.stalled_ranks)) if evidence.ranks else None,
            "trainmon_diagnosis_step_seconds": evidence.step_seconds,
            "trainmon_diagnosis_sm_active_ratio": evidence.sm_active_ratio,
            "trainmon_diagnosis_sm_occupancy_ratio": evidence.sm_occupancy_ratio,
            "trainmon_diagnosis_tensor_active_ratio": evidence.tensor_active_ratio,
            "trainmon_diagnosis_dram_active_ratio": evidence.dram_active_ratio,
            "trainmon_diagnosis_memory_used_ratio": evidence.memory_used_ratio,
        }
        for name, value in values.items():
            if value is not None:
                gauges[name].add_metric(job, value)
    fail_slow = GaugeMetricFamily(
        "trainmon_diagnosis_fail_slow_ratio",
        "How much slower the rank (\"\": the job) became than it was, over its step time "
        "before (0.25: 25 % slower); part: the part of the step that grew (compute, "
        "data_wait, comm, step), cause: what the node's evidence names.",
        labels=["job", "owner", "rank", "part", "cause"],
    )
    fail_slow_start = GaugeMetricFamily(
        "trainmon_diagnosis_fail_slow_start_timestamp_seconds",
        "Unix time at which the fail-slow change of the rank (\"\": the job) started.",
        labels=["job", "owner", "rank"],
    )
    for verdict in verdicts:
        job = [verdict.job, owners.get(verdict.job, "")]
        for finding in verdict.findings:
            if finding.code != "fail_slow":
                continue
            said = finding.values
            rank = str(said.get("rank", ""))
            fail_slow.add_metric(
                [*job, rank, str(said.get("part", "")), str(said.get("cause", ""))],
                float(said.get("ratio", 0.0)))
            fail_slow_start.add_metric([*job, rank], float(said.get("start", 0.0)))
    window = GaugeMetricFamily(
        "trainmon_diagnosis_window_seconds",
        "Span of the samples behind the current verdicts, seconds.",
    )
    window.add_metric([], window_seconds)
    return [bottleneck, findings, *gauges.values(), fail_slow, fail_slow_start, window]


def _build(config: DiagnosisConfig, wiring: Wiring) -> Collector:
    return DiagnosisCollector(config)


#: Derived, after the sources, numa and attribution: it reads the families
#: collected before it; it and the collectors after it are evaluated on the
#: registry's clock, not on scrapes.
ENTRY = CollectorEntry("diagnosis", DiagnosisConfig, _build, derived=True)
