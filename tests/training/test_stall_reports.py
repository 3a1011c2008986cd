"""Stall lines (``"type": "stall"``, docs/protocol.md "Stall reports"): validated,
redacted, bounded; kept by the store for a reporting rank until its steps move on;
exported as ``trainmon_training_stalled`` and ``trainmon_training_stall_info``."""

from __future__ import annotations

import json

import pytest

from testkit.exposition import scrape
from tests.training.training_support import FakeClock, report
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.training.protocol import (
    MAX_STALL_FRAMES,
    REDACTED,
    ReportError,
    StallReport,
    parse,
)
from trainmon.training.receiver import ingest_payload
from trainmon.training.report_fields import MAX_GROUP_NAME_LENGTH


def stall(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "v": 1, "type": "stall", "job": "resnet50", "rank": 0, "world_size": 8,
        "reporter_id": "a1b2c3d4e5f60718", "steps": 10, "since": 1_700_000_000.0,
        "where": "data_loader",
        "frames": [{"file": "/work/dataset.py", "line": 42, "function": "__getitem__",
                    "code": "time.sleep(3600)"},
                   {"file": "/work/train.py", "line": 7, "function": "main", "code": ""}],
    }
    base.update(changes)
    return base


def encoded(*lines: dict[str, object]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_a_stall_line_parses_innermost_frame_first() -> None:
    parsed = parse(encoded(stall(collective={"op": "all_reduce", "seq": 311,
                                             "since": 1_700_000_001.0}))[:-1])
    assert isinstance(parsed, StallReport)
    assert parsed.where == "data_loader" and parsed.steps == 10
    assert parsed.frames[0].function == "__getitem__" and parsed.frames[0].line == 42
    assert (parsed.collective, parsed.collective_seq) == ("all_reduce", 311)
    assert parsed.collective_group is None  # a client that does not name the group


def test_a_stall_line_names_the_process_group_of_its_collective() -> None:
    parsed = parse(encoded(stall(where="collective", collective={
        "op": "all_gather_into_tensor", "seq": 12, "group": "tp"}))[:-1])
    assert isinstance(parsed, StallReport)
    assert (parsed.collective, parsed.collective_seq, parsed.collective_group) == (
        "all_gather_into_tensor", 12, "tp")


def test_secrets_in_source_lines_and_paths_are_redacted() -> None:
    parsed = parse(encoded(stall(frames=[
        {"file": "/mnt/s3://AKIA:SECRET@bucket/x.py", "line": 1, "function": "f",
         "code": 'api_key = "sk-123"'}]))[:-1])
    assert isinstance(parsed, StallReport)
    assert "SECRET" not in parsed.frames[0].file
    assert parsed.frames[0].code == REDACTED


@pytest.mark.parametrize("changes", [
    {"where": "somewhere"},
    {"frames": [{"file": "/a.py", "line": 1, "function": "f"}] * (MAX_STALL_FRAMES + 1)},
    {"frames": [{"file": "/a.py\nInjected", "line": 1, "function": "f"}]},
    {"frames": [{"file": "/a.py", "line": -1, "function": "f"}]},
    {"frames": [{"file": "/a.py", "line": 1, "function": "f" * 200}]},
    {"frames": "not a list"},
    {"collective": {"op": "all reduce"}},
    {"collective": "all_reduce"},
    {"collective": {"op": "all_reduce", "group": ""}},
    {"collective": {"op": "all_reduce", "group": "t p"}},
    {"collective": {"op": "all_reduce", "group": 3}},
    {"collective": {"op": "all_reduce", "group": "g" * (MAX_GROUP_NAME_LENGTH + 1)}},
    {"steps": -1},
    {"since": float("nan")},
    {"phase": "bad phase"},
])
def test_hostile_stall_lines_are_invalid(changes: dict[str, object]) -> None:
    line = json.dumps(stall(**changes)).encode()
    with pytest.raises(ReportError) as raised:
        parse(line)
    assert raised.value.reason in ("invalid_field", "invalid_label", "malformed")


def collector() -> TrainingCollector:
    clock = FakeClock()
    training = TrainingCollector(TrainingConfig(socket=None), clock=clock,
                                 wall_clock=lambda: 1_700_000_100.0)
    training.start()
    return training


def test_a_stall_holds_until_the_ranks_steps_move_on() -> None:
    training = collector()
    try:
        result = ingest_payload(training.store, encoded(report(), stall()), "http", 128)
        assert not result.errors, result.errors
        held = scrape(training)
        buckets = [0] * STEP_BUCKET_COUNT
        buckets[4] = 11
        moved_on = report(steps=11, samples=352, step_seconds=2.2, step_buckets=buckets)
        result = ingest_payload(training.store, encoded(moved_on), "http", 128)
        assert not result.errors, result.errors
        cleared = scrape(training)
    finally:
        training.stop()
    assert held.value("trainmon_training_stalled", job="resnet50", rank="0") == 1.0
    assert held.value("trainmon_training_stall_start_timestamp_seconds", job="resnet50",
                      rank="0") == 1_700_000_000.0
    (info,) = held.labelsets("trainmon_training_stall_info")
    assert info["where"] == "data_loader" and info["frame"] == "dataset.py:42 __getitem__"
    assert (info["collective"], info["seq"], info["group"]) == ("", "", "")
    assert cleared.value("trainmon_training_stalled", job="resnet50", rank="0") == 0.0
    assert cleared.labelsets("trainmon_training_stall_info") == []


def test_a_stall_claiming_more_steps_than_its_rank_reported_clears_at_the_next_step() -> None:
    training = collector()
    try:
        result = ingest_payload(training.store, encoded(report(), stall(steps=10_000_000)),
                                "http", 128)
        assert not result.errors, result.errors
        held = scrape(training)
        buckets = [0] * STEP_BUCKET_COUNT
        buckets[4] = 11
        moved_on = report(steps=11, samples=352, step_seconds=2.2, step_buckets=buckets)
        ingest_payload(training.store, encoded(moved_on), "http", 128)
        cleared = scrape(training)
    finally:
        training.stop()
    assert held.value("trainmon_training_stalled", job="resnet50", rank="0") == 1.0
    assert cleared.value("trainmon_training_stalled", job="resnet50", rank="0") == 0.0


def test_a_stall_of_a_rank_that_never_reported_or_of_another_writer_is_refused() -> None:
    training = collector()
    try:
        alone = ingest_payload(training.store, encoded(stall()), "http", 128)
        ingest_payload(training.store, encoded(report()), "http", 128, identity="uid:1000")
        foreign = ingest_payload(training.store, encoded(stall()), "http", 128,
                                 identity="uid:1001")
        stale = ingest_payload(training.store, encoded(stall(reporter_id="0" * 16)), "http",
                               128, identity="uid:1000")
        exposition = scrape(training)
    finally:
        training.stop()
    assert [error.reason for error in alone.errors] == ["invalid_field"]
    assert [error.reason for error in foreign.errors] == ["forbidden"]
    assert [error.reason for error in stale.errors] == ["invalid_field"]
    assert exposition.value("trainmon_training_stalled", job="resnet50", rank="0") == 0.0


def test_the_stalled_collectives_group_is_a_label_of_stall_info() -> None:
    training = collector()
    try:
        waiting = stall(rank=1, where="collective", frames=[],
                        collective={"op": "all_reduce", "seq": 311, "group": "dp"})
        unnamed = stall(rank=2, where="collective", frames=[],
                        collective={"op": "all_reduce", "seq": 311})
        result = ingest_payload(training.store, encoded(
            report(rank=1), report(rank=2), waiting, unnamed), "http", 128)
        assert not result.errors, result.errors
        exposition = scrape(training)
    finally:
        training.stop()
    assert exposition.series("trainmon_training_stall_info", "job", "owner", "rank", "where",
                             "phase", "collective", "seq", "frame", "group") == {
        ("resnet50", "local", "1", "collective", "", "all_reduce", "311", "", "dp"): 1.0,
        ("resnet50", "local", "2", "collective", "", "all_reduce", "311", "", ""): 1.0,
    }
