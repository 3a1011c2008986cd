"""What ``trainmon top`` shows: a report of the last seconds as rows, without words.

``Recorder`` keeps the snapshots of the last ``window_seconds`` (as ``doctor``
measures over ``--seconds``; at least ``MIN_SNAPSHOTS``) and builds, on every refresh, the report of
``trainmon.report.model.build_report`` over them: the same engine, the same
verdicts as ``doctor`` and the daemon. ``rows`` turns that report into one
``JobRow`` per reporting job with a ``RankRow`` per rank, and ``held_gpus`` the
GPUs that processes without training telemetry hold (``idle_held``,
``no_telemetry``). Per rank, all over the window:

- step time: step seconds / steps; samples/s: the rate of
  ``trainmon_training_samples_total`` over the time the snapshots holding it span;
- data wait and exposed communication as shares of the step time (the measured
  exposed communication where the rank measures it, else its comm phase:
  ``RankState.comm_wait_seconds``), the latter per process group (``dp``, ``tp``...)
  where the rank reports groups;
- its GPU's utilization, SM activity (GPM) and memory used, from the report's GPUs;
- its ``Mark``s, from the job's findings: the rank a ``hung_rank`` names
  (``hung``, or ``gone`` for a silent reporter), the others of that finding
  (``waiting`` in a collective, else ``stalled``), the ranks of ``stalled``, the
  rank of ``straggler`` (``straggler``) or else the job's slowest rank with its work
  over the median from ``SLOWEST_SHOWN_RATIO`` on (``slowest``: evidence below the
  threshold, shown dim), and a rank's ``fail_slow``.

A hang or stall lasts seconds, a refresh one: a mark that clears is kept for
``MARK_HOLD_SECONDS`` with the seconds since it cleared (``Mark.ago``), so it
is not missed between two glances. Words and layout are ``render``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from trainmon.diagnosis.finding import Finding
from trainmon.diagnosis.measure import RankState
from trainmon.diagnosis.rules import Verdict
from trainmon.diagnosis.samples import ScrapedSamples, Window
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import DOCTOR_SAMPLES
from trainmon.report.messages import hung_rank_entries
from trainmon.report.model import GPU, Report, Source, build_report

#: Seconds of snapshots each view is measured over (``doctor``'s default ``--seconds``).
WINDOW_SECONDS = 10.0
#: Snapshots kept however old: through Prometheus, one comes per scrape (15 s
#: apart by default), and a window of one has no rates.
MIN_SNAPSHOTS = 3
#: Seconds a mark stays shown after it cleared.
MARK_HOLD_SECONDS = 60.0
#: The samples ``top`` keeps: ``doctor``'s, and the ranks' samples for samples/s.
TOP_SAMPLES = DOCTOR_SAMPLES | {"trainmon_training_samples_total"}
#: The job's slowest rank is marked (``slowest``, below the straggler threshold) from
#: this work ratio over the median on: below it, the spread of step times that
#: jitter leaves in a window of a few seconds.
SLOWEST_SHOWN_RATIO = 1.03
#: Mark codes, most urgent first (the order of the ``mark`` sort).
MARK_CODES = ("hung", "gone", "stalled", "waiting", "straggler", "fail_slow", "slowest")


@dataclass(frozen=True)
class Mark:
    """What was found about a rank: ``code`` (``MARK_CODES``) and what goes with it, as
    the engine's findings say it (label values, which the renderer cleans)."""

    code: str
    #: Where a hung or stalled rank is (``data_loader``, ``collective``...; "" unknown).
    where: str = ""
    #: The collective a rank waits in, or the part that became slower (``fail_slow``).
    name: str = ""
    #: Seconds since its last step (hung, stalled, waiting) or report (gone).
    seconds: float | None = None
    #: Work over the job's median (straggler, slowest); slowdown (fail_slow).
    ratio: float | None = None
    #: Seconds since it cleared; None while it holds.
    ago: float | None = None

    @property
    def urgency(self) -> int:
        """Its place in ``MARK_CODES`` (0 most urgent); a cleared mark after all others."""
        return MARK_CODES.index(self.code) + (len(MARK_CODES) if self.ago is not None else 0)


@dataclass(frozen=True)
class RankRow:
    job: str
    rank: str
    gpu: str
    #: Mean step (seconds) and samples per second over the window; None: no step.
    step_seconds: float | None
    samples_per_second: float | None
    #: Shares of the step time (0-1).
    data_wait_ratio: float | None
    comm_ratio: float | None
    #: ``(group, exposed share of the step time)`` per process group.
    comm_groups: tuple[tuple[str, float], ...]
    #: Its GPU (0-1): mean utilization, SM active (GPM), memory used over total.
    gpu_utilization: float | None
    sm_active: float | None
    memory_used_ratio: float | None
    marks: tuple[Mark, ...] = ()

    @property
    def urgency(self) -> int:
        """Its most urgent mark's (``Mark.urgency``); past every mark when it has none."""
        return min((mark.urgency for mark in self.marks), default=2 * len(MARK_CODES))


@dataclass(frozen=True)
class JobRow:
    verdict: Verdict
    #: Goodput over the window the ledger exports (0-1); None where not booked.
    goodput: float | None
    ranks: tuple[RankRow, ...]

    @property
    def job(self) -> str:
        return self.verdict.job


@dataclass(frozen=True)
class HeldGPU:
    """A GPU held by processes that report no training steps."""

    gpu: str
    #: The holder as ``diagnose`` names it: ``pod:<ns>/<pod>``, ``slurm:<id>``, ``pid:<pid>``.
    holder: str
    pids: str
    #: ``idle_held`` (it does no work) or ``no_telemetry`` (it works, unseen).
    code: str
    utilization: float | None


@dataclass(frozen=True)
class TopView:
    """One screen's data."""

    #: The source read, as the header names it.
    source: str
    #: The report of the latest window; None before the first snapshot.
    report: Report | None
    jobs: tuple[JobRow, ...] = ()
    held: tuple[HeldGPU, ...] = ()
    #: Why the source cannot be read now ("" while it can), and the Unix time of the
    #: newest snapshot shown.
    problem: str = ""
    wall: float | None = None


def rows(report: Report, window: Window) -> tuple[JobRow, ...]:
    """One row per job that reports ranks, each with its ranks (in the engine's order)."""
    ranks: dict[str, list[RankState]] = {}
    for rank in report.ranks:
        ranks.setdefault(rank.job, []).append(rank)
    gpus = {gpu.state.gpu: gpu for gpu in report.gpus}
    samples = _samples_per_second(window)
    goodput = {entry.job: entry.ratio for entry in report.goodput}
    jobs = []
    for verdict in report.verdicts:
        if verdict.job not in ranks:
            continue  # a holder without telemetry: held_gpus
        marks = _marks(verdict)
        jobs.append(JobRow(verdict, goodput.get(verdict.job), tuple(
            _rank_row(rank, gpus.get(rank.gpu), samples.get((rank.job, rank.rank)),
                      marks.get(rank.rank, ()))
            for rank in ranks[verdict.job])))
    return tuple(jobs)


def held_gpus(report: Report) -> tuple[HeldGPU, ...]:
    """The GPUs of the verdicts of processes without training telemetry, and the GPUs
    a job's processes hold idle beside those its ranks report (``idle_held``)."""
    gpus = {gpu.state.gpu: gpu for gpu in report.gpus}
    rank_gpus: dict[str, set[str]] = {}
    for rank in report.ranks:
        rank_gpus.setdefault(rank.job, set()).add(rank.gpu)
    held = []
    for verdict in report.verdicts:
        if verdict.job in rank_gpus:
            for gpu in verdict.evidence.idle_gpus:
                if gpu not in rank_gpus[verdict.job] and (state := gpus.get(gpu)) is not None:
                    pids = ",".join(each.process.pid for each in state.processes)
                    held.append(HeldGPU(gpu, verdict.job, pids, "idle_held",
                                        state.state.utilization))
            continue
        finding = verdict.findings[0]
        for gpu in verdict.evidence.gpus:
            state = gpus.get(gpu)
            held.append(HeldGPU(gpu, verdict.job, str(finding.values.get("pids", "")),
                                finding.code, None if state is None else state.state.utilization))
    return tuple(held)


def _rank_row(rank: RankState, gpu: GPU | None, samples: float | None,
              marks: tuple[Mark, ...]) -> RankRow:
    step = rank.step_seconds

    def share(seconds: float | None) -> float | None:
        return None if seconds is None or step <= 0 else seconds / step

    state = None if gpu is None else gpu.state
    return RankRow(
        job=rank.job, rank=rank.rank, gpu=rank.gpu,
        step_seconds=step / rank.steps if rank.steps else None,
        samples_per_second=samples,
        data_wait_ratio=share(rank.data_wait_seconds),
        comm_ratio=share(rank.comm_wait_seconds),
        comm_groups=tuple((group, seconds / step) for group, seconds in rank.group_exposed
                          if step > 0),
        gpu_utilization=None if state is None else state.utilization,
        sm_active=None if state is None else state.sm_active,
        memory_used_ratio=None if state is None else state.memory_used_ratio,
        marks=marks)


def _samples_per_second(window: Window) -> dict[tuple[str, str], float]:
    rates = {}
    for labels in window.label_sets("trainmon_training_samples_total"):
        names = dict(labels)
        rate = window.rate("trainmon_training_samples_total", labels)
        if rate is not None:
            rates[(names.get("job", ""), names.get("rank", ""))] = rate
    return rates


def _marks(verdict: Verdict) -> dict[str, tuple[Mark, ...]]:
    """Each rank's marks from the job's findings, most urgent first."""
    marks: dict[str, list[Mark]] = {}

    def add(rank: str, mark: Mark) -> None:
        if rank and all(each.code != mark.code for each in marks.get(rank, ())):
            marks.setdefault(rank, []).append(mark)

    codes = {finding.code for finding in verdict.findings}
    for finding in verdict.findings:
        for rank, mark in _finding_marks(finding):
            add(rank, mark)
    evidence = verdict.evidence
    ratio = evidence.straggler_ratio
    if "straggler" not in codes and ratio is not None and ratio >= SLOWEST_SHOWN_RATIO:
        add(evidence.straggler_rank, Mark("slowest", ratio=ratio))
    return {rank: tuple(sorted(found, key=lambda mark: mark.urgency))
            for rank, found in marks.items()}


def _finding_marks(finding: Finding) -> Iterable[tuple[str, Mark]]:
    values = finding.values
    if finding.code == "hung_rank":
        culprit = str(values.get("rank", ""))
        entries = hung_rank_entries(values)
        for rank, where, collective, _seq, _frame, seconds in entries:
            silent = _number(seconds)
            if where == "gone":
                yield rank, Mark("gone", seconds=silent)
            elif rank == culprit:
                yield rank, Mark("hung", where, seconds=silent)
            elif where == "collective":
                yield rank, Mark("waiting", where, collective, silent)
            else:
                yield rank, Mark("stalled", where, seconds=silent)
        if culprit and culprit not in {entry[0] for entry in entries}:
            yield culprit, Mark("hung", str(values.get("where", "")))
    elif finding.code == "stalled":
        for rank in str(values.get("ranks", "")).split(","):
            yield rank, Mark("stalled", seconds=_number(values.get("seconds")))
    elif finding.code == "straggler":
        yield str(values.get("rank", "")), Mark("straggler",
                                                ratio=_number(values.get("factor")))
    elif finding.code == "fail_slow":
        yield str(values.get("rank", "")), Mark(
            "fail_slow", name=str(values.get("part", "")), ratio=_number(values.get("ratio")))


def _number(value: object) -> float | None:
    """A finding's value as a number; None when it is none."""
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


class Recorder:
    """The snapshots of the last ``window_seconds`` and the marks seen lately: a
    ``TopView`` after each snapshot."""

    def __init__(self, config: DiagnosisConfig, source: Source,
                 window_seconds: float = WINDOW_SECONDS,
                 hold_seconds: float = MARK_HOLD_SECONDS) -> None:
        self._config = config
        self._source = source
        self._window_seconds = window_seconds
        self._hold_seconds = hold_seconds
        self._snapshots: list[ScrapedSamples] = []
        #: (job, rank) → (mark, Unix time it was last seen holding).
        self._seen: dict[tuple[str, str], dict[str, tuple[Mark, float]]] = {}

    def add(self, snapshot: ScrapedSamples) -> bool:
        """Keep ``snapshot`` if it is newer than the last (a Prometheus series that was
        not scraped again is not); drop those older than the window. Whether kept."""
        if self._snapshots and snapshot.at <= self._snapshots[-1].at:
            return False
        self._snapshots.append(snapshot)
        while (len(self._snapshots) > MIN_SNAPSHOTS
               and snapshot.at - self._snapshots[0].at > self._window_seconds):
            self._snapshots.pop(0)
        return True

    def reset(self) -> None:
        """Forget the snapshots (another daemon answers now); the marks stay."""
        self._snapshots.clear()

    def view(self, name: str, problem: str = "") -> TopView:
        """The view of the window, or only ``problem`` before any snapshot."""
        if not self._snapshots:
            return TopView(name, None, problem=problem)
        window = Window(self._snapshots)
        report = build_report(window, self._config, self._source)
        jobs = self._with_held_marks(rows(report, window), window.last.wall)
        return TopView(name, report, jobs, held_gpus(report), problem, window.last.wall)

    def _with_held_marks(self, jobs: tuple[JobRow, ...], now: float) -> tuple[JobRow, ...]:
        """``jobs`` with the marks of the last ``hold_seconds`` that no longer hold."""
        for job in jobs:
            for rank in job.ranks:
                seen = self._seen.setdefault((rank.job, rank.rank), {})
                for mark in rank.marks:
                    seen[mark.code] = (mark, now)
        for key, seen in list(self._seen.items()):
            for code, (_, at) in list(seen.items()):
                if now - at > self._hold_seconds:
                    del seen[code]
            if not seen:
                del self._seen[key]
        updated = []
        for job in jobs:
            ranks = []
            for rank in job.ranks:
                current = {mark.code for mark in rank.marks}
                cleared = [replace(mark, ago=now - at) for code, (mark, at)
                           in self._seen.get((rank.job, rank.rank), {}).items()
                           if code not in current and code != "slowest"]
                ranks.append(replace(rank, marks=tuple(sorted(
                    (*rank.marks, *cleared), key=lambda mark: mark.urgency))))
            updated.append(replace(job, ranks=tuple(ranks)))
        return tuple(updated)
