"""The diagnosis on the daemon's clock, and ended jobs leaving it.

Real ``Reporter`` threads step and report over the training socket to a real
``TrainingCollector``; the diagnosis (a 5 s window: an evaluation every
0.25 s) and the collectors after it run in a started ``CollectorRegistry`` as
in the daemon. ``VerdictProbe``, after the diagnosis, tells the test which
verdicts each evaluation produced, so it waits on evaluations, not on time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from testkit.exposition import scrape
from testkit.prometheus import wait_until
from tests.diagnosis.diagnosis_support import (
    EVALUATION_TIMEOUT_SECONDS,
    SteppingJob,
    VerdictProbe,
    held,
    job_verdicts,
)
from tests.ledger.ledger_support import description, send, step
from trainmon.collectors.diagnosis import DiagnosisCollector
from trainmon.collectors.ledger import LedgerCollector
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.core.collector import Collector
from trainmon.core.registry import CollectorRegistry
from trainmon.diagnosis.measure import MEASURED_SAMPLES, measure
from trainmon.diagnosis.samples import ScrapedSamples, Window
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.ledger import Ledger
from trainmon.ledger.config import LedgerConfig
from trainmon.ledger.recorder import RunRecorder
from trainmon.report.document import report_json
from trainmon.report.model import build_report

WINDOW = DiagnosisConfig(window_seconds=5.0)


class Node:
    """A training collector on a socket under ``folder``, the diagnosis, and the
    collectors after it, in a registry; jobs step through real reporters."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.training = TrainingCollector(TrainingConfig(socket=folder / "steps.sock"))
        self.probe = VerdictProbe()
        self.registry: CollectorRegistry | None = None
        self.jobs: list[SteppingJob] = []

    def start(self, *after_diagnosis: Collector) -> CollectorRegistry:
        self.registry = CollectorRegistry(
            [self.training, DiagnosisCollector(WINDOW), *after_diagnosis, self.probe])
        self.registry.start()
        return self.registry

    def job(self, name: str) -> SteppingJob:
        job = SteppingJob(name, f"unix://{self.folder / 'steps.sock'}")
        self.jobs.append(job)
        return job

    def stop(self) -> None:
        for job in self.jobs:
            job.close()
        if self.registry is not None:
            self.registry.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    built = Node(tmp_path)
    yield built
    built.stop()


def doctor_jobs(registry: CollectorRegistry, snapshots: int = 3) -> list[str]:
    """The jobs ``doctor`` reports from what the registry exports (one snapshot per scrape)."""
    taken = [ScrapedSamples.from_families(registry.collect(), time.monotonic(), time.time(),
                                          MEASURED_SAMPLES) for _ in range(snapshots)]
    report = report_json(build_report(Window(taken), WINDOW, {"kind": "local"}))
    return [job["job"] for job in report["jobs"]]


def test_the_first_scrape_after_a_start_has_a_verdict(node: Node) -> None:
    registry = node.start()
    node.job("llm")
    # a few evaluation intervals of steps, and nothing scraped yet
    node.probe.wait_for(held("llm", "compute", 4))
    first = scrape(registry)
    assert job_verdicts(first) == {"llm": "compute"}
    assert {row["finding"] for row in first.labelsets("trainmon_diagnosis_finding_info")
            } == {"gpu_bound"}
    assert first.value("trainmon_diagnosis_window_seconds") > 0


def test_a_verdict_exists_and_reaches_the_ledger_with_no_scrape(
    node: Node, tmp_path: Path
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = LedgerCollector(RunRecorder(LedgerConfig(path=path, node="node-1", flush_seconds=0.1),
                                         node.training.store, node.training.storage_of))
    registry = node.start(ledger)
    job = node.job("llm")
    wait_until(lambda: ledger.health()["recording_runs"] == 1, EVALUATION_TIMEOUT_SECONDS,
               "the ledger to record the run", interval=0.02)
    node.probe.wait_for(held("llm", "compute", 6))
    diagnosis = registry.health()["collectors"]["diagnosis"]  # type: ignore[index]
    assert diagnosis["verdicts"] == {"llm": "compute"}  # type: ignore[index]
    job.close()
    registry.stop()  # the ledger's last flush
    with Ledger.open(path) as reader:
        (record,) = reader.runs()
    assert record.end_reason == "finished"
    verdicts = record.summary["verdicts"]
    assert isinstance(verdicts, dict)
    # "none" while the first steps were fewer than min_steps, then compute
    assert set(verdicts) <= {"none", "compute"} and verdicts["compute"] > 0, verdicts


def test_a_job_whose_reporter_closed_leaves_the_live_verdicts(node: Node) -> None:
    registry = node.start()
    done, running = node.job("done"), node.job("running")
    node.probe.wait_for(lambda verdicts: verdicts[-1].keys() == {"done", "running"})
    assert sorted(doctor_jobs(registry)) == ["done", "running"]
    done.close()
    wait_until(lambda: ("done", done.reporter.run) in node.training.store.snapshot().ended_runs,
               EVALUATION_TIMEOUT_SECONDS, "the ended description", interval=0.02)
    # the next evaluation that saw it lists "running" only, long before the rank's
    # TTL (300 s) and before the window (5 s) forgets the job's steps
    seen = len(node.probe.verdicts)
    latest = node.probe.wait_for(lambda verdicts: len(verdicts) >= seen + 2)
    assert latest.keys() == {"running"}
    result = scrape(registry)
    assert job_verdicts(result) == {"running": "compute"}
    # the ended rank keeps its series, with its final totals, until the TTL, marked
    assert result.value("trainmon_training_steps_total", job="done", rank="0") == (
        done.reporter.report()["steps"])
    assert [row["job"] for row in result.labelsets(
        "trainmon_training_rank_end_timestamp_seconds")] == ["done"]
    assert {row["job"] for row in result.labelsets("trainmon_training_run_info")} == {
        "running"}
    assert doctor_jobs(registry) == ["running"]
    assert running.reporter.dropped_reports == 0


@pytest.mark.parametrize(("lines", "live"), [
    # the description says ended: the rank is marked
    ([description(), step(10), description(ended="finished")], False),
    # the rank's next run is described before its first report: still ended ...
    ([description(), step(10), description(ended="finished"), description(run="run-b")],
     False),
    # ... and back with that report
    ([description(), step(10), description(ended="finished"), description(run="run-b"),
      step(20, run="run-b")], True),
    # a run restarted under the same run id is live again
    ([description(), step(10), description(ended="finished"), description()], True),
    # a run that stopped without saying it ended stays until the TTL
    ([description(), step(10)], True),
    # an old client: reports without a run and no description
    ([{key: value for key, value in step(10).items() if key != "run"}], True),
])
def test_which_ranks_count_as_ended(
    lines: Sequence[dict[str, object]], live: bool,
    make_training: Callable[[], TrainingCollector],
) -> None:
    training = make_training()
    send(training, *lines)
    result = scrape(training)
    ended = result.value("trainmon_training_rank_end_timestamp_seconds",
                         job="resnet50", rank="0")
    assert (ended is None) == live
    if ended is not None:  # the rank's latest report or description, by the daemon's clock
        assert ended == pytest.approx(time.time(), abs=60)
    assert result.value("trainmon_training_rank_info", job="resnet50", rank="0") == 1
    # what the diagnosis makes of it
    snapshots = [ScrapedSamples.from_families(scrape_families, at, time.time(),
                                              MEASURED_SAMPLES)
                 for at, scrape_families in ((0.0, training.collect()),
                                             (1.0, training.collect()))]
    ranks = measure(Window(snapshots)).ranks
    assert [rank.job for rank in ranks] == (["resnet50"] if live else [])


def rank_snapshot(at: float, *, ended: bool) -> ScrapedSamples:
    rank = (("job", "llm"), ("rank", "0"))
    samples = {"trainmon_training_step_seconds_count": {rank: at * 10},
               "trainmon_training_step_seconds_sum": {rank: at}}
    if ended:
        samples["trainmon_training_rank_end_timestamp_seconds"] = {rank: 1.7e9}
    return ScrapedSamples(at, 1.7e9 + at, samples)


@pytest.mark.parametrize(("history", "measured"), [
    ([False, True], False),  # ended in the newest snapshot
    ([False, True, None], False),  # ended, then expired: gone for good, not back as "none"
    ([True, False], True),  # its next run reported
    ([False, None], True),  # expired without a word: as before, until the window forgets it
])
def test_a_rank_is_judged_by_the_newest_snapshot_that_holds_it(
    history: list[bool | None], measured: bool
) -> None:
    snapshots = [rank_snapshot(float(at), ended=ended) if ended is not None
                 else ScrapedSamples(float(at), 1.7e9 + at, {})
                 for at, ended in enumerate(history)]
    assert bool(measure(Window(snapshots)).ranks) == measured


@pytest.fixture
def make_training() -> Iterator[Callable[[], TrainingCollector]]:
    started: list[TrainingCollector] = []

    def make() -> TrainingCollector:
        training = TrainingCollector(TrainingConfig(socket=None))
        training.start()
        started.append(training)
        return training

    yield make
    for training in started:
        training.stop()
