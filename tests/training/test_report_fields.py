"""One wire schema: the client's reports and the daemon's validator agree with
``trainmon.training.report_fields.REPORT_FIELDS`` on every field.

The client side is a real ``Reporter`` (its ``report()``, encoded as it
sends it); the daemon side the real ``parse_report``. A field added to the
schema but not to the client, the validator or ``StepReport`` fails here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainmon.client import Reporter
from trainmon.training.protocol import ReportError, StepReport, encode_report, parse_report
from trainmon.training.report_fields import (
    COMM_GROUP_FIELDS,
    FIELDS_BY_NAME,
    REPORT_FIELDS,
    CommGroup,
    ReportField,
    build_report,
)


def comm_groups(sent: dict[str, dict[str, object]]) -> dict[str, CommGroup]:
    return {name: CommGroup(**group) for name, group in sent.items()}  # type: ignore[arg-type]


#: Fields whose value the daemon normalises: (sent, as StepReport holds it).
NORMALISED: dict[str, Callable[[Any], object]] = {
    "step_buckets": tuple, "gpu": str, "comm_groups": comm_groups}
#: A value of the wrong JSON type for each kind of field.
WRONG_TYPE = {"integer": "1", "number": "1.5", "label": 7, "reporter_id": 7, "run_id": 7,
              "gpu": "gpu0", "path": 7, "buckets": {}, "phases": [], "version": "1",
              "comm_groups": [], "sketch": []}


@pytest.fixture
def reporter(tmp_path: Path) -> Iterator[Reporter]:
    """A reporter that knows every field: steps, communication, a checkpoint."""
    with Reporter("schema-job", rank=1, local_rank=1, world_size=2, gpu=1, run="run-7",
                  endpoint=f"unix://{tmp_path}/none.sock", environ={}) as reporter:
        for _ in range(3):
            reporter.add_phase("comm", 0.001)
            reporter.step(32)
        reporter.add_comm(0.002, 0.001, 4096)
        reporter.checkpoint_saved(str(tmp_path / "step-3.pt"), 0.5)
        # what Reporter.instrument attaches (trainmon.client.distributed.CommMeter, which
        # needs a DDP model: tests/client/test_instrument.py), counting 24 buckets
        reporter._comm_source = CountedBuckets()
        yield reporter


class CountedBuckets:
    """A ``CommSource`` that has launched 24 collectives, none in flight: 16 on its
    data-parallel group, 8 on its tensor-parallel one (every key of a group known)."""

    def fold(self) -> None:
        pass

    def close(self) -> None:
        pass

    def in_flight(self, thread: int | None = None) -> None:
        return None

    def launched_collectives(self) -> int:
        return 24

    def groups(self, step_seconds: float) -> dict[str, dict[str, object]]:
        return {
            "dp": {"collectives": 16, "bytes": 1 << 20, "seconds": 0.002,
                   "exposed_seconds": 0.0, "seq": 16, "root": 1},
            "tp": {"collectives": 8, "bytes": 4096, "seconds": 0.001,
                   "exposed_seconds": 0.0, "seq": 8, "root": 0},
        }


def test_the_client_sends_every_field_of_the_schema_in_its_order(reporter: Reporter) -> None:
    sent = reporter.report()

    assert list(sent) == [spec.name for spec in REPORT_FIELDS]


def test_the_daemon_accepts_every_field_the_client_sends_as_sent(reporter: Reporter) -> None:
    sent = reporter.report()

    parsed = parse_report(encode_report(sent))

    for spec in REPORT_FIELDS:
        if spec.kind == "version":
            continue
        normalised = NORMALISED.get(spec.name)
        expected = sent[spec.name] if normalised is None else normalised(sent[spec.name])
        assert getattr(parsed, spec.name) == expected, spec.name


def test_a_reporter_leaves_out_exactly_what_it_does_not_know(tmp_path: Path) -> None:
    with Reporter("fresh", endpoint=f"unix://{tmp_path}/none.sock", environ={}) as fresh:
        sent = fresh.report()  # no step, no communication, no checkpoint yet

    left_out = {spec.name for spec in REPORT_FIELDS if spec.name not in sent}
    assert left_out == {spec.name for spec in REPORT_FIELDS if spec.omitted_when_unknown}
    parsed = parse_report(encode_report(sent))
    for name in left_out:
        assert getattr(parsed, name) is None, name


def test_step_report_has_one_attribute_per_field_and_the_same_required_ones() -> None:
    attributes = {item.name: item for item in dataclasses.fields(StepReport)}
    wire = {spec.name: spec for spec in REPORT_FIELDS if spec.kind != "version"}

    assert set(attributes) == set(wire)
    required = {name for name, item in attributes.items()
                if item.default is dataclasses.MISSING
                and item.default_factory is dataclasses.MISSING}
    assert required == {name for name, spec in wire.items() if spec.required}


@pytest.mark.parametrize("spec", REPORT_FIELDS, ids=lambda spec: spec.name)
def test_each_field_is_checked_as_the_schema_says(reporter: Reporter, spec: ReportField) -> None:
    sent = reporter.report()
    # and the fields that need it or are bounded by it: without it they are refused
    gone = {spec.name} | {other.name for other in REPORT_FIELDS
                          if other.needs == spec.name or spec.name in other.at_most}
    without = {name: value for name, value in sent.items() if name not in gone}

    if spec.required:
        with pytest.raises(ReportError):
            parse_report(json.dumps(without).encode())
    else:
        parsed = parse_report(json.dumps(without).encode())
        absent = spec.absent if spec.default_with_needed is None else spec.default_with_needed
        assert getattr(parsed, spec.name) == absent
    with pytest.raises(ReportError) as rejected:
        parse_report(json.dumps({**sent, spec.name: WRONG_TYPE[spec.kind]}).encode())
    if spec.kind == "version":
        assert rejected.value.reason == "unsupported_version"
    else:
        assert rejected.value.reason in ("invalid_field", "invalid_label")
        assert spec.name in rejected.value.detail


def test_every_relation_names_fields_of_the_schema() -> None:
    for spec in REPORT_FIELDS:
        for other in (*spec.at_most, spec.below, spec.adds_up_to, spec.needs):
            assert other is None or other in FIELDS_BY_NAME, (spec.name, other)
        assert not (spec.required and spec.omitted_when_unknown), spec.name
    group_keys = {spec.name for spec in COMM_GROUP_FIELDS}
    for spec in COMM_GROUP_FIELDS:
        assert set(spec.at_most) <= group_keys, spec.name


def test_comm_group_has_one_attribute_per_key_and_the_same_required_ones() -> None:
    attributes = {item.name: item for item in dataclasses.fields(CommGroup)}

    assert list(attributes) == [spec.name for spec in COMM_GROUP_FIELDS]
    assert {name for name, item in attributes.items()
            if item.default is dataclasses.MISSING} == {
        spec.name for spec in COMM_GROUP_FIELDS if spec.required}


def test_build_report_takes_exactly_the_schemas_fields(tmp_path: Path) -> None:
    with Reporter("fresh", endpoint=f"unix://{tmp_path}/none.sock", environ={}) as fresh:
        sent = fresh.report()
    values = {spec.name: sent.get(spec.name) for spec in REPORT_FIELDS}  # None: unknown

    assert build_report(dict(values)) == sent
    with pytest.raises(ValueError, match=r"missing: \['samples'\]"):
        build_report({name: value for name, value in values.items() if name != "samples"})
    with pytest.raises(ValueError, match=r"extra: \['sample_count'\]"):
        build_report({**values, "sample_count": 3})


def test_build_report_sends_each_group_with_its_unknown_keys_left_out(tmp_path: Path) -> None:
    with Reporter("fresh", endpoint=f"unix://{tmp_path}/none.sock", environ={}) as fresh:
        known = fresh.report()
    values = {spec.name: known.get(spec.name) for spec in REPORT_FIELDS}  # None: unknown
    values["comm_groups"] = {
        "dp": CommGroup(collectives=3, bytes=96, seconds=0.5, root=0),
        "tp": {"collectives": 1, "bytes": 8, "seconds": 0.25, "exposed_seconds": None,
               "seq": 1},
    }

    sent = build_report(dict(values))

    assert sent["comm_groups"] == {
        "dp": {"collectives": 3, "bytes": 96, "seconds": 0.5, "root": 0},
        "tp": {"collectives": 1, "bytes": 8, "seconds": 0.25, "seq": 1},
    }
    assert parse_report(encode_report(sent)).comm_groups == {
        "dp": CommGroup(collectives=3, bytes=96, seconds=0.5, root=0),
        "tp": CommGroup(collectives=1, bytes=8, seconds=0.25, seq=1),
    }
    with pytest.raises(ValueError, match=r"extra: \['calls'\]"):
        build_report({**values, "comm_groups": {"dp": {"calls": 3}}})
