"""``trainmon doctor``'s history line: is this run slower than the previous comparable one?

Comparable = the same job and config hash (``Ledger.previous``); slower = its
median samples/s per rank recorded (so that a run with fewer ranks on this node
is not "slower") below the previous run's by more than
``contract.THROUGHPUT_REGRESSION_RATIO``, the share the
``TrainmonThroughputRegression`` alert uses. "This run" is the job's latest run
in the node's ledger, as the daemon's recorder keeps it up to date. An absent or
unusable ledger gives no line (``doctor`` reports the present, the history is a
bonus), never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainmon import contract
from trainmon.ledger import Ledger, LedgerError, RunRecord
from trainmon.runs.compare import signed_percent
from trainmon.runs.timespec import utc_text
from trainmon.runs.view import number

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Regression:
    job: str
    run: str
    previous_run: str
    previous_started: float
    #: b / a − 1 of the median samples/s (negative: slower).
    change_ratio: float

    @property
    def text(self) -> str:
        return (f"samples/s {signed_percent(self.change_ratio)} vs run {self.previous_run} "
                f"({utc_text(self.previous_started)}); "
                f"trainmon compare {self.previous_run} {self.run}")

    def to_json(self) -> dict[str, object]:
        return {"job": self.job, "run": self.run, "previous_run": self.previous_run,
                "previous_started": self.previous_started,
                "change_ratio": round(self.change_ratio, 4), "text": self.text}


def slower_runs(path: Path, jobs: Iterable[str],
                ratio: float = contract.THROUGHPUT_REGRESSION_RATIO) -> list[Regression]:
    """One ``Regression`` per job of ``jobs`` whose latest run is slower than its previous
    comparable run by more than ``ratio``; [] without a usable ledger at ``path``."""
    if not path.exists():
        return []
    try:
        ledger = Ledger.open(path, readonly=True)
    except LedgerError as error:
        log.info("no run history for doctor: %s", error)
        return []
    try:
        found = []
        for job in sorted(set(jobs)):
            latest = ledger.runs(job=job)
            if not latest:
                continue
            current = latest[0]
            previous = ledger.previous(job, current.config_hash, before=current.started)
            if previous is None:
                continue
            now = _per_rank(current)
            before = _per_rank(previous)
            if now is None or not before:
                continue
            change = now / before - 1
            if change < -ratio:
                found.append(Regression(job, current.run, previous.run, previous.started,
                                        change))
        return found
    except LedgerError as error:
        log.info("no run history for doctor: %s", error)
        return []
    finally:
        ledger.close()


def _per_rank(record: RunRecord) -> float | None:
    rate = number(record.summary.get("samples_per_second_median"))
    return None if rate is None else rate / max(record.ranks, 1)
