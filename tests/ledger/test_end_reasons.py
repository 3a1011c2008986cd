"""How a run ended on this node, from what its ranks said or did not say, and the
``trainmon_training_run_end_timestamp_seconds`` series that shows it for an hour."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.exposition import scrape
from tests.ledger.ledger_support import Clocks, description, make_recorder, only, send, step
from trainmon.ledger import Ledger
from trainmon.ledger.recorder import MAX_EXPORTED_RUN_ENDS, RUN_END_EXPORT_SECONDS

REPORTERS = ("a1b2c3d4e5f60718", "b1b2c3d4e5f60718")


def two_ranks(clocks: Clocks, training, ledger, run: str = "run-a") -> None:  # type: ignore[no-untyped-def]
    """Ranks 0 and 1 of a 2-rank run, both described and stepping for 30 s."""
    for rank, reporter in enumerate(REPORTERS):
        send(training, description(run=run, rank=rank, reporter_id=reporter, world_size=2),
             step(0, run=run, rank=rank, reporter_id=reporter, world_size=2))
    ledger.tick()
    for index in range(1, 4):
        clocks.advance(10)
        for rank, reporter in enumerate(REPORTERS):
            send(training, step(index * 10, run=run, rank=rank, reporter_id=reporter,
                                world_size=2))
        ledger.tick()


def say(training, rank: int, ended: str, run: str = "run-a") -> None:  # type: ignore[no-untyped-def]
    send(training, description(run=run, rank=rank, reporter_id=REPORTERS[rank], world_size=2,
                               ended=ended))


@pytest.mark.parametrize(("words", "reason"), [
    (("finished", "finished"), "finished"),
    (("finished", "crashed"), "crashed"),
    (("preempted", "finished"), "preempted"),
    (("preempted", "crashed"), "crashed"),  # a crash outranks a preemption
    (("finished", None), "lost"),  # rank 1 went silent without a word
    (("preempted", None), "preempted"),  # said outranks silent
    ((None, None), "lost"),
])
def test_the_run_ends_as_its_ranks_said(
    clocks: Clocks, tmp_path: Path, words: tuple[str | None, str | None], reason: str,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    two_ranks(clocks, training, ledger)
    for rank, word in enumerate(words):
        if word is not None:
            say(training, rank, word)
    ledger.tick()
    if None in words:
        with Ledger.open(path) as reader:  # a silent rank may still come back
            assert only(reader.runs()).end_reason is None
        clocks.advance(61)  # past the training TTL: the silent rank is gone
        ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        record = only(reader.runs())
    assert (record.end_reason, record.ranks, record.world_size) == (reason, 2, 2)
    assert record.ended is not None


def relaunched(training, ledger, path: Path) -> dict[str, str | None]:  # type: ignore[no-untyped-def]
    """Both ranks relaunched into ``run-b`` (new reporters) before the next tick; the end
    reason of every run recorded then."""
    for rank, reporter in enumerate(("c1b2c3d4e5f60718", "d1b2c3d4e5f60718")):
        send(training, description(run="run-b", rank=rank, reporter_id=reporter, world_size=2),
             step(0, run="run-b", rank=rank, reporter_id=reporter, world_size=2))
    ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        return {record.run: record.end_reason for record in reader.runs()}


def test_ranks_that_go_on_with_another_run_without_a_word_lost_the_first(
        clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    two_ranks(clocks, training, ledger)
    ends = relaunched(training, ledger, path)
    assert ends == {"run-a": "lost", "run-b": None}


def test_a_word_replaced_by_the_ranks_next_run_before_a_tick_still_counts(
        clocks: Clocks, tmp_path: Path) -> None:
    """Rank 1 says ``crashed`` and is relaunched into its next run before the recorder
    reads the store: the store remembers the word, so the run is not ``finished``."""
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    two_ranks(clocks, training, ledger)
    say(training, 0, "finished")
    say(training, 1, "crashed")
    ends = relaunched(training, ledger, path)
    assert ends == {"run-a": "crashed", "run-b": None}


def test_each_end_is_exported_for_an_hour(clocks: Clocks, tmp_path: Path) -> None:
    training, ledger = make_recorder(clocks, tmp_path / "ledger.sqlite3",
                                     flush_seconds=3600.0, stall_seconds=30.0)()
    ledger.start()
    two_ranks(clocks, training, ledger, run="run-a")
    say(training, 0, "crashed")
    say(training, 1, "finished")
    ledger.tick()
    crashed_at = clocks.wall
    two_ranks(clocks, training, ledger, run="run-b")
    for _ in range(4):  # heartbeats, no steps: stalled since its last step
        clocks.advance(10)
        for rank, reporter in enumerate(REPORTERS):
            send(training, step(30, run="run-b", rank=rank, reporter_id=reporter,
                                world_size=2))
        ledger.tick()
    stalled_since = clocks.wall - 40
    ends = run_ends(ledger)
    assert ends == {("resnet50", "run-a", "crashed"): crashed_at,
                    ("resnet50", "run-b", "stalled"): stalled_since}
    goodput = {labels["run"]: labels["goodput"] for labels in scrape(ledger).labelsets(
        "trainmon_training_run_end_timestamp_seconds")}
    # the crashed run's share is final; the stalled one goes on, so it has none yet
    assert goodput["run-a"].endswith("%") and goodput["run-b"] == ""
    clocks.advance(10)
    for rank, reporter in enumerate(REPORTERS):  # steps again: no longer stalled
        send(training, step(40, run="run-b", rank=rank, reporter_id=reporter, world_size=2))
    ledger.tick()
    assert run_ends(ledger) == {
        ("resnet50", "run-a", "crashed"): crashed_at}
    clocks.advance(RUN_END_EXPORT_SECONDS - (clocks.wall - crashed_at) + 1)
    assert run_ends(ledger) == {}
    ledger.stop()


def test_at_most_the_latest_ends_are_exported(clocks: Clocks, tmp_path: Path) -> None:
    training, ledger = make_recorder(clocks, tmp_path / "ledger.sqlite3",
                                     flush_seconds=3600.0)()
    ledger.start()
    runs = [f"run-{index:02d}" for index in range(MAX_EXPORTED_RUN_ENDS + 3)]
    for run in runs:
        send(training, description(run=run, started=clocks.wall), step(0, run=run))
        ledger.tick()
        clocks.advance(10)
        send(training, description(run=run, started=clocks.wall - 10, ended="finished"))
        ledger.tick()
    exported = run_ends(ledger)
    ledger.stop()
    assert sorted(run for _, run, _ in exported) == runs[-MAX_EXPORTED_RUN_ENDS:]
    assert {reason for _, _, reason in exported} == {"finished"}


def run_ends(ledger) -> dict[tuple[str, str, str], float]:  # type: ignore[no-untyped-def]
    """``trainmon_training_run_end_timestamp_seconds`` by (job, run, reason), each run's
    owner the in-process writer that reported it."""
    ends = scrape(ledger).series(
        "trainmon_training_run_end_timestamp_seconds", "job", "run", "reason", "goodput",
        "owner")
    assert {key[4] for key in ends} <= {"local"}, ends
    return {key[:3]: value for key, value in ends.items()}
