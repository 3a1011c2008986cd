"""``trainmon doctor``'s run history: each job's latest run against its baseline.

From the node's ledger, for the jobs ``doctor`` diagnosed (``live``): each
job's latest run (as the daemon's recorder keeps it up to date) and the run it
is measured against (``trainmon.runs.baseline``: the previous comparable run,
finished where one did), how its samples/s per rank recorded moved, and
whether that is slower by more than ``contract.THROUGHPUT_REGRESSION_RATIO``,
the share the ``TrainmonThroughputRegression`` alert uses; beside it the
fastest comparable run of the alert's look-back when the run is that much
slower than it too, and that run is another.

For the jobs that run no more (``ended``, doctor after the job): the latest
run of each other job that ended within ``RECENT_SECONDS`` of now (or, still
recorded as running, was last updated then), newest first, at most
``MAX_RECENT_JOBS``, each against its baseline too.

The ledger is read in one pass for the latest run of every job (one record per
job held), then once per job shown for its earlier runs. An absent or unusable
ledger gives no history (``doctor`` reports the present; the history is a
bonus), never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from trainmon.ledger import Ledger, LedgerError, RunRecord
from trainmon.runs.baseline import (
    Baseline,
    change_ratio,
    choose_baseline,
    comparable,
    fastest,
    rate,
    slower,
)

log = logging.getLogger(__name__)

#: Doctor after the job: the jobs whose latest run ended within this many seconds (a
#: day: last night's runs, seen in the morning).
RECENT_SECONDS = 86400.0
#: The most jobs listed after the job (the most recently ended first).
MAX_RECENT_JOBS = 10


@dataclass(frozen=True)
class JobHistory:
    """A job's latest run on this node and what it is measured against."""

    run: RunRecord
    baseline: Baseline | None
    #: samples/s per rank recorded against the baseline's, less 1 (negative: slower).
    change_ratio: float | None
    #: The fastest comparable run of the look-back, when it is not the baseline and
    #: the run is slower than it by more than the regression share; else None.
    fastest: RunRecord | None = None
    fastest_change_ratio: float | None = None

    @property
    def job(self) -> str:
        return self.run.job

    @property
    def slower(self) -> bool:
        """Slower than the baseline by more than the regression share."""
        return slower(self.change_ratio)

    @property
    def samples_per_second(self) -> float | None:
        return rate(self.run)


@dataclass(frozen=True)
class LedgerHistory:
    """What ``doctor`` shows of the ledger."""

    #: One per diagnosed job that has a run in the ledger, by job name.
    live: tuple[JobHistory, ...]
    #: The latest run of each job not diagnosed now that ended within ``RECENT_SECONDS``.
    ended: tuple[JobHistory, ...]
    #: The ledger read, for the commands shown.
    path: Path


def read_history(path: Path, live_jobs: Collection[str], now: float, *,
                 recent_seconds: float = RECENT_SECONDS) -> LedgerHistory | None:
    """The history of ``live_jobs`` and of the jobs that ended lately (module
    docstring); None without a usable ledger at ``path``."""
    if not path.exists():
        return None
    try:
        ledger = Ledger.open(path, readonly=True)
    except LedgerError as error:
        log.info("no run history for doctor: %s", error)
        return None
    try:
        latest: dict[str, RunRecord] = {}
        for record in ledger.each_run():  # newest first: the first of a job is its latest
            latest.setdefault(record.job, record)
        live = [_history(ledger, latest[job], now) for job in sorted(set(live_jobs))
                if job in latest]
        recent = sorted((record for job, record in latest.items()
                         if job not in live_jobs and _last_seen(record) >= now - recent_seconds),
                        key=_last_seen, reverse=True)[:MAX_RECENT_JOBS]
        ended = [_history(ledger, record, now) for record in recent]
        return LedgerHistory(tuple(live), tuple(ended), path)
    except LedgerError as error:
        log.info("no run history for doctor: %s", error)
        return None
    finally:
        ledger.close()


def _last_seen(record: RunRecord) -> float:
    """When the run ended, or (still running) its latest update."""
    return record.ended if record.ended is not None else record.updated


def _history(ledger: Ledger, run: RunRecord, now: float) -> JobHistory:
    earlier = [record for record in ledger.each_run(job=run.job) if comparable(run, record)]
    baseline = choose_baseline(run, earlier)
    ratio = None if baseline is None else change_ratio(run, baseline.record)
    best = fastest(run, earlier, now)
    if best is None or (baseline is not None and best == baseline.record):
        return JobHistory(run, baseline, ratio)
    best_ratio = change_ratio(run, best)
    if not slower(best_ratio):
        return JobHistory(run, baseline, ratio)
    return JobHistory(run, baseline, ratio, best, best_ratio)
