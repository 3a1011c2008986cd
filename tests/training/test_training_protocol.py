"""Protocol v1 validation: every malformed report is refused with the documented reason."""

from __future__ import annotations

import json
from typing import cast

import pytest

from tests.training.training_support import line, report
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.training.protocol import (
    MAX_LINE_BYTES,
    ReportError,
    StepReport,
    decode_payload,
    encode_report,
    parse_report,
    sanitize_label,
)
from trainmon.training.report_fields import MAX_PHASES


def test_valid_report_parses_with_every_field() -> None:
    parsed = parse_report(line().rstrip(b"\n"))
    assert parsed == StepReport(
        job="resnet50", rank=0, reporter_id="a1b2c3d4e5f60718", steps=10, samples=320,
        step_seconds=2.0, data_wait_seconds=0.5,
        step_buckets=tuple(cast(list[int], report()["step_buckets"])),
        phase_seconds={"comm": 0.25}, dropped_reports=0, local_rank=0, world_size=8, gpu="0",
        pid=4242, last_step_time=1_700_000_000.0,
    )


def test_optional_fields_may_be_absent_or_null() -> None:
    minimal = {
        key: value for key, value in report().items()
        if key in ("v", "job", "rank", "reporter_id", "steps", "samples", "step_seconds",
                   "data_wait_seconds", "step_buckets")
    }
    parsed = parse_report(json.dumps({**minimal, "gpu": None, "pid": None}).encode())
    assert (parsed.gpu, parsed.pid, parsed.world_size, parsed.phase_seconds) == (
        None, None, None, {},
    )


def test_measured_comm_fields_parse_and_absent_means_unmeasured() -> None:
    parsed = parse_report(json.dumps(report(
        comm_seconds=1.5, comm_exposed_seconds=0.25, comm_bytes=2**40)).encode())
    assert (parsed.comm_seconds, parsed.comm_exposed_seconds, parsed.comm_bytes) == (
        1.5, 0.25, 2**40)
    plain = parse_report(line().rstrip(b"\n"))
    nulls = parse_report(json.dumps(report(
        comm_seconds=None, comm_exposed_seconds=None, comm_bytes=None)).encode())
    for parsed in (plain, nulls):
        assert (parsed.comm_seconds, parsed.comm_exposed_seconds, parsed.comm_bytes) == (
            None, None, None)
    # Communication fully overlapped with compute: comm time may exceed the step time.
    assert parse_report(json.dumps(report(
        comm_seconds=5.0, comm_exposed_seconds=0.0)).encode()).comm_seconds == 5.0


@pytest.mark.parametrize(
    "changes",
    [
        {"comm_seconds": 1.0, "comm_exposed_seconds": 1.5},  # exposed > comm
        {"comm_exposed_seconds": 0.1},  # exposed without comm
        {"comm_seconds": 3.0, "comm_exposed_seconds": 2.5},  # exposed > step_seconds (2.0)
        {"comm_seconds": -0.5},
        {"comm_seconds": "1.0"},
        {"comm_seconds": True},
        {"comm_seconds": [1.0]},
        {"comm_seconds": 1.0, "comm_exposed_seconds": -0.1},
        {"comm_seconds": 1.0, "comm_exposed_seconds": "0.1"},
        {"comm_bytes": 1.5},
        {"comm_bytes": -1},
        {"comm_bytes": "1000"},
        {"comm_bytes": False},
        {"comm_bytes": 2**60},
    ],
)
def test_hostile_comm_fields_are_invalid(changes: dict[str, object]) -> None:
    with pytest.raises(ReportError) as raised:
        parse_report(json.dumps(report(**changes)).encode())
    assert raised.value.reason == "invalid_field"


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_comm_seconds_are_invalid(number: bytes) -> None:
    payload = line(comm_seconds=1.0).rstrip(b"\n").replace(b'"comm_seconds": 1.0',
                                                          b'"comm_seconds": ' + number)
    assert number in payload
    with pytest.raises(ReportError) as raised:
        parse_report(payload)
    assert raised.value.reason == "invalid_field"


def test_encode_roundtrip_and_nan_refused() -> None:
    assert parse_report(encode_report(report()).rstrip(b"\n")).samples == 320
    with pytest.raises(ValueError):
        encode_report(report(step_seconds=float("nan")))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"this is not json", "malformed"),
        (b'{"v": 1, "job": "resnet50", "rank": 0, "steps"', "malformed"),  # truncated
        (b"\xff\xfe{}", "malformed"),
        (b"[1, 2, 3]", "malformed"),
        (b"[" * 5000 + b"]" * 5000, "malformed"),
        (json.dumps(report(v=2)).encode(), "unsupported_version"),
        (json.dumps(report(v=True)).encode(), "unsupported_version"),
        (json.dumps({k: v for k, v in report().items() if k != "v"}).encode(),
         "unsupported_version"),
        (json.dumps(report(steps="10")).encode(), "invalid_field"),
        (json.dumps(report(steps=10.5)).encode(), "invalid_field"),
        (json.dumps(report(steps=True)).encode(), "invalid_field"),
        (json.dumps(report(rank=-1)).encode(), "invalid_field"),
        (json.dumps(report(rank=8)).encode(), "invalid_field"),  # >= world_size
        (json.dumps(report(samples=-5)).encode(), "invalid_field"),
        (json.dumps(report(samples=2**60)).encode(), "invalid_field"),
        (json.dumps(report(step_seconds=-0.1)).encode(), "invalid_field"),
        (line().replace(b'"step_seconds": 2.0', b'"step_seconds": NaN'), "invalid_field"),
        (line().replace(b'"step_seconds": 2.0', b'"step_seconds": Infinity'), "invalid_field"),
        (line().replace(b'"step_seconds": 2.0', b'"step_seconds": -Infinity'), "invalid_field"),
        (line().replace(b'"step_seconds": 2.0', b'"step_seconds": 1e999'), "invalid_field"),
        (json.dumps(report(data_wait_seconds=3.0)).encode(), "invalid_field"),
        (json.dumps(report(step_buckets=[10])).encode(), "invalid_field"),
        (json.dumps(report(step_buckets=[1] * STEP_BUCKET_COUNT)).encode(), "invalid_field"),
        (json.dumps(report(phase_seconds=[1, 2])).encode(), "invalid_field"),
        (json.dumps(report(phase_seconds={"comm": -1})).encode(), "invalid_field"),
        (json.dumps(report(gpu="GPU-1234")).encode(), "invalid_field"),
        (json.dumps(report(pid=0)).encode(), "invalid_field"),
        (json.dumps(report(reporter_id="has space")).encode(), "invalid_field"),
        (json.dumps(report(job=123)).encode(), "invalid_field"),
        (json.dumps(report(job="")).encode(), "invalid_label"),
        (json.dumps(report(job='a"b')).encode(), "invalid_label"),
        (json.dumps(report(job="a\nb")).encode(), "invalid_label"),
        (json.dumps(report(job="a\\b")).encode(), "invalid_label"),
        (json.dumps(report(job="résumé")).encode(), "invalid_label"),
        (json.dumps(report(job="x" * 129)).encode(), "invalid_label"),
        (json.dumps(report(phase_seconds={"a}b": 1.0})).encode(), "invalid_label"),
        (json.dumps(report(phase_seconds={f"p{i}": 0.0 for i in range(MAX_PHASES + 1)})).encode(),
         "limit"),
        (b'{"v": 1, "job": "' + b"x" * MAX_LINE_BYTES + b'"}', "too_large"),
    ],
)
def test_hostile_lines_are_refused_with_their_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(ReportError) as raised:
        parse_report(payload)
    assert raised.value.reason == reason


def test_one_bad_line_does_not_cost_the_others() -> None:
    payload = line(rank=0) + b"garbage\n\n" + line(rank=1)
    results = list(decode_payload(payload))
    assert [type(item).__name__ for item in results] == ["StepReport", "ReportError",
                                                         "StepReport"]


def test_longer_label_limit_is_configurable() -> None:
    long_job = "j" * 200
    assert parse_report(json.dumps(report(job=long_job)).encode(), 256).job == long_job


@pytest.mark.parametrize(
    ("raw", "sent"),
    [("resnet50", "resnet50"), ("my job", "my_job"), ('a"b\nc', "a_b_c"), ("", "_"),
     ("日本", "__")],
)
def test_sanitize_label_maps_onto_the_charset(raw: str, sent: str) -> None:
    assert sanitize_label(raw) == sent
    parse_report(json.dumps(report(job=sanitize_label(raw))).encode())
