"""The run ledger records a run's stalls: when, the rank that held the job and where."""

from __future__ import annotations

from pathlib import Path

from tests.ledger.ledger_support import Clocks, description, make_recorder, only, send, step
from trainmon.ledger import Ledger

REPORTERS = ("a" * 16, "b" * 16)


def stall(rank: int, where: str, frame: str, since: float) -> dict[str, object]:
    return {"v": 1, "type": "stall", "job": "resnet50", "rank": rank, "world_size": 2,
            "reporter_id": REPORTERS[rank], "run": "run-a", "steps": 100, "since": since,
            "where": where, "frames": [{"file": f"/work/{frame}", "line": 42,
                                        "function": "f"}]}


def test_a_stall_is_recorded_with_the_rank_that_held_the_job(tmp_path: Path) -> None:
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    try:
        for rank in (0, 1):
            send(training, description(rank=rank, world_size=2, reporter_id=REPORTERS[rank],
                                       started=clocks.wall),
                 step(100, rank=rank, world_size=2, reporter_id=REPORTERS[rank]))
        ledger.tick()
        stopped = clocks.wall
        clocks.advance(15)
        for rank, where, frame in ((0, "collective", "graph.py"),
                                   (1, "data_loader", "dataset.py")):
            send(training, step(100, rank=rank, world_size=2, reporter_id=REPORTERS[rank]),
                 stall(rank, where, frame, stopped))
        ledger.tick()
        clocks.advance(10)
        for rank in (0, 1):  # steps again
            send(training, step(110, rank=rank, world_size=2, reporter_id=REPORTERS[rank]))
        ledger.tick()
        resumed = clocks.wall
    finally:
        ledger.stop()
        training.stop()
    with Ledger.open(path) as reader:
        record = only(reader.runs(job="resnet50"))
    [recorded] = record.summary["stalls"]  # type: ignore[misc]
    assert recorded == {"since": stopped, "until": resumed, "holds": "1",
                        "where": "data_loader", "frame": "dataset.py:42 f",
                        "ranks": {"0": "collective", "1": "data_loader"}}
