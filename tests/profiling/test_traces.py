"""The trace keeper: what it keeps, what it refuses, and its bounds
(``trainmon.profiling.traces``)."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainmon.profiling.traces import StoredTrace, TraceKeeper, TraceProblem
from trainmon.training.protocol import ProfileReport

TRACE = gzip.compress(json.dumps({"traceEvents": [{"name": "aten::mm", "ph": "X"}]}).encode(),
                      mtime=0)


def report(request_id: str = "0" * 31 + "1", rank: int = 0, run: str = "run-1"
           ) -> ProfileReport:
    return ProfileReport(job="j", rank=rank, reporter_id="r", run=run, id=request_id,
                         steps=5, seconds=0.5)


class Keeper:
    """A started keeper whose outcomes are waited for."""

    def __init__(self, folder: Path, **bounds: int) -> None:
        settings = {"max_trace_bytes": 1 << 20, "max_uncompressed_bytes": 1 << 22,
                    "max_traces_per_run": 3, "max_traces": 100, "max_total_bytes": 1 << 30}
        settings.update(bounds)
        self.keeper = TraceKeeper(folder / "profiles", **settings)
        self.outcomes: list[StoredTrace | TraceProblem] = []
        self._arrived = threading.Condition()
        self.keeper.start()

    def keep(self, data: bytes | int, upload: ProfileReport | None = None
             ) -> StoredTrace | TraceProblem:
        if isinstance(data, int):
            descriptor = data
        else:
            with tempfile.TemporaryFile() as file:
                file.write(data)
                file.flush()
                descriptor = os.dup(file.fileno())
        before = len(self.outcomes)
        try:
            self.keeper.submit(upload or report(), "uid:1000", descriptor, self._done)
        except TraceProblem as refused:
            return refused
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.outcomes) > before, timeout=10)
        return self.outcomes[-1]

    def _done(self, _: ProfileReport, owner: str, outcome: StoredTrace | TraceProblem) -> None:
        with self._arrived:
            self.outcomes.append(outcome)
            self._arrived.notify_all()


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[Keeper]:
    made = Keeper(tmp_path)
    yield made
    made.keeper.stop()


def test_a_trace_is_kept_under_its_owner_and_run(keeper: Keeper, tmp_path: Path) -> None:
    stored = keeper.keep(TRACE)
    assert isinstance(stored, StoredTrace)
    assert stored.path == tmp_path / "profiles" / "uid-1000" / "run-1" / (
        "rank0-" + "0" * 31 + "1.json.gz")
    assert stored.path.read_bytes() == TRACE and stored.size == len(TRACE)
    assert os.stat(stored.path).st_mode & 0o777 == 0o640
    assert keeper.keeper.usage() == (1, len(TRACE))


#: What is refused, by name (the bytes are made in the test: ids stay the same in
#: every xdist worker).
REFUSED: dict[str, tuple[Callable[[], bytes], str]] = {
    "empty": (lambda: b"", "invalid_trace"),
    "not gzip": (lambda: b"plain text, not gzip", "invalid_trace"),
    "gzip of text": (lambda: gzip.compress(b"not a JSON object"), "invalid_trace"),
    "junk after the stream": (lambda: TRACE + b"junk after the stream", "invalid_trace"),
    "cut short": (lambda: TRACE[:-8], "invalid_trace"),
    "5 MiB uncompressed": (lambda: gzip.compress(b"{" + b" " * (5 << 20)), "too_large"),
    "2 MiB compressed": (lambda: os.urandom(2 << 20), "too_large"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_is_not_a_whole_gzipped_json_trace_within_bounds_is_refused(
        keeper: Keeper, case: str) -> None:
    make, reason = REFUSED[case]
    outcome = keeper.keep(make())
    assert isinstance(outcome, TraceProblem) and outcome.reason == reason, outcome
    assert keeper.keeper.usage() == (0, 0)


def test_a_descriptor_that_is_not_a_regular_file_is_refused_unread(keeper: Keeper) -> None:
    read_end, write_end = os.pipe()  # reading it would wait forever
    try:
        outcome = keeper.keep(read_end)
        assert isinstance(outcome, TraceProblem) and outcome.reason == "invalid_trace"
    finally:
        os.close(write_end)


def test_a_run_keeps_its_latest_traces_and_the_whole_folder_its_bound(tmp_path: Path) -> None:
    made = Keeper(tmp_path, max_traces_per_run=2, max_traces=3)
    try:
        kept = []
        for index in range(3):
            outcome = made.keep(TRACE, report(f"{index + 1:032x}"))
            assert isinstance(outcome, StoredTrace)
            kept.append(outcome.path)
            time.sleep(0.01)  # distinct modification times
        assert [path.exists() for path in kept] == [False, True, True]
        others = [made.keep(TRACE, report(f"{index + 10:032x}", run="run-2"))
                  for index in range(2)]
        assert all(isinstance(outcome, StoredTrace) for outcome in others)
        assert made.keeper.usage()[0] == 3  # the oldest of all went
        assert made.keeper.evicted == 2
        assert not kept[1].exists() and kept[2].exists()
    finally:
        made.keeper.stop()
    # a new keeper takes stock of what the folder holds
    again = Keeper(tmp_path, max_traces=3)
    try:
        assert again.keeper.usage() == (3, 3 * len(TRACE))
    finally:
        again.keeper.stop()


def test_a_full_queue_refuses_at_once_and_closes_the_descriptor(tmp_path: Path) -> None:
    keeper = TraceKeeper(tmp_path / "profiles", max_trace_bytes=1 << 20,
                         max_uncompressed_bytes=1 << 22, max_traces_per_run=3,
                         max_traces=10, max_total_bytes=1 << 30)  # not started: nothing reads
    descriptors = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]
    refused = []
    for descriptor in descriptors:
        try:
            keeper.submit(report(), "uid:1", descriptor, lambda *_: None)
        except TraceProblem as problem:
            refused.append(problem.reason)
    assert refused == ["busy"]
    with pytest.raises(OSError):
        os.fstat(descriptors[2])  # closed by the keeper
    keeper.stop()  # closes the queued ones
    for descriptor in descriptors[:2]:
        with pytest.raises(OSError):
            os.fstat(descriptor)
