"""Communication per process group (a report's ``comm_groups``, docs/protocol.md):
validated one rule at a time, kept monotonic per rank through restarts and reports
that leave groups out, bounded per rank, exported as ``trainmon_training_group_*``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from testkit.exposition import scrape
from tests.training.training_support import FakeClock, line, push, report
from trainmon.collectors.training import TrainingCollector
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.training.protocol import ReportError, parse_report
from trainmon.training.report_fields import (
    MAX_COMM_GROUPS,
    MAX_GROUP_NAME_LENGTH,
    MAX_RANK,
    CommGroup,
)
from trainmon.training.writers import uid_writer

Make = Callable[..., TrainingCollector]
PROTOCOL_DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"

GROUP_COUNTERS = (
    "trainmon_training_group_collectives_total",
    "trainmon_training_group_comm_bytes_total",
    "trainmon_training_group_comm_seconds_total",
    "trainmon_training_group_comm_exposed_seconds_total",
)


def group(**changes: object) -> dict[str, object]:
    """A group that launched 40 collectives of 1 MiB each, 0.5 s in flight, 0.125 s waited."""
    base: dict[str, object] = {"collectives": 40, "bytes": 40 << 20, "seconds": 0.5,
                               "exposed_seconds": 0.125, "seq": 40, "root": 0}
    base.update(changes)
    return {key: value for key, value in base.items() if value is not None}


def parsed(**groups: object) -> Mapping[str, CommGroup] | None:
    return parse_report(json.dumps(report(comm_groups=groups)).encode()).comm_groups


# -- the validator --------------------------------------------------------------


def test_a_dp_by_tp_rank_reports_both_of_its_groups() -> None:
    groups = parsed(dp=group(root=1), tp=group(collectives=960, bytes=3 << 30, seconds=1.5,
                                               exposed_seconds=0.75, seq=960, root=0))
    assert groups == {
        "dp": CommGroup(collectives=40, bytes=40 << 20, seconds=0.5, exposed_seconds=0.125,
                        seq=40, root=1),
        "tp": CommGroup(collectives=960, bytes=3 << 30, seconds=1.5, exposed_seconds=0.75,
                        seq=960, root=0),
    }


def test_the_documented_dp_by_tp_report_is_valid() -> None:
    section = PROTOCOL_DOCS.read_text().split("### Communication per process group")[1]
    example = re.search(r"```json\n(.*?)```", section, re.DOTALL)
    assert example is not None
    sent = json.loads(example.group(1))

    parsed_report = parse_report(json.dumps(sent).encode())

    assert parsed_report.comm_groups == {
        "dp": CommGroup(collectives=3200, bytes=429_496_729_600, seconds=98.2,
                        exposed_seconds=12.4, seq=3200, root=5),
        "tp": CommGroup(collectives=48000, bytes=1_288_490_188_800, seconds=151.0,
                        exposed_seconds=49.3, seq=48000, root=0),
    }


def test_absent_or_null_comm_groups_is_unknown_and_an_empty_object_is_no_group() -> None:
    assert parse_report(line().rstrip(b"\n")).comm_groups is None
    assert parse_report(json.dumps(report(comm_groups=None)).encode()).comm_groups is None
    assert parsed() == {}


def test_the_optional_keys_of_a_group_may_be_absent_or_null() -> None:
    groups = parsed(dp=group(exposed_seconds=None, seq=None, root=None),
                    tp={**group(), "exposed_seconds": None, "seq": None, "root": None})
    assert groups is not None
    for name in ("dp", "tp"):
        assert groups[name] == CommGroup(collectives=40, bytes=40 << 20, seconds=0.5), name


def test_the_limits_themselves_are_accepted() -> None:
    groups = parsed(**{f"g{index}": group() for index in range(MAX_COMM_GROUPS - 1)},
                    **{"n" * MAX_GROUP_NAME_LENGTH: group(root=MAX_RANK, exposed_seconds=0.5)})
    assert groups is not None and len(groups) == MAX_COMM_GROUPS
    assert groups["n" * MAX_GROUP_NAME_LENGTH].root == MAX_RANK


@pytest.mark.parametrize(
    ("groups", "reason"),
    [
        ([group()], "invalid_field"),  # not an object
        ("dp", "invalid_field"),
        ({f"g{index}": group() for index in range(MAX_COMM_GROUPS + 1)}, "limit"),
        ({"": group()}, "invalid_label"),
        ({"d p": group()}, "invalid_label"),
        ({"dp\n": group()}, "invalid_label"),
        ({"n" * (MAX_GROUP_NAME_LENGTH + 1): group()}, "invalid_label"),
        ({"dp": [40, 1024, 0.5]}, "invalid_field"),  # a value that is not an object
        ({"dp": 40}, "invalid_field"),
        ({"dp": {**group(), "calls": 40}}, "invalid_field"),  # unknown key
        ({"dp": group(collectives=None)}, "invalid_field"),  # a required key missing
        ({"dp": group(bytes=None)}, "invalid_field"),
        ({"dp": group(seconds=None)}, "invalid_field"),
        ({"dp": {**group(), "collectives": None}}, "invalid_field"),
        ({"dp": group(collectives=-1)}, "invalid_field"),  # negative
        ({"dp": group(bytes=-1)}, "invalid_field"),
        ({"dp": group(seconds=-0.5)}, "invalid_field"),
        ({"dp": group(exposed_seconds=-0.1)}, "invalid_field"),
        ({"dp": group(seq=-1)}, "invalid_field"),
        ({"dp": group(root=-1)}, "invalid_field"),
        ({"dp": group(root=MAX_RANK + 1)}, "invalid_field"),  # beyond the largest rank
        ({"dp": group(collectives=True)}, "invalid_field"),  # booleans are not integers
        ({"dp": group(seq=False)}, "invalid_field"),
        ({"dp": group(root=True)}, "invalid_field"),
        ({"dp": group(seconds=True)}, "invalid_field"),
        ({"dp": group(collectives=40.5)}, "invalid_field"),  # fractions are not integers
        ({"dp": group(bytes="1024")}, "invalid_field"),
        ({"dp": group(seconds="0.5")}, "invalid_field"),
        ({"dp": group(bytes=2**60)}, "invalid_field"),  # beyond 2^53
        ({"dp": group(seconds=0.5, exposed_seconds=0.75)}, "invalid_field"),  # > seconds
        # > the report's step_seconds (2.0), though within the group's seconds
        ({"dp": group(seconds=3.0, exposed_seconds=2.5)}, "invalid_field"),
    ],
)
def test_hostile_comm_groups_are_refused_with_their_reason(groups: object, reason: str) -> None:
    with pytest.raises(ReportError) as raised:
        parse_report(json.dumps(report(comm_groups=groups)).encode())
    assert raised.value.reason == reason
    assert "comm_groups" in raised.value.detail


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_group_seconds_are_invalid(number: bytes) -> None:
    payload = json.dumps(report(comm_groups={"dp": group(seconds=1.0)})).encode()
    payload = payload.replace(b'"seconds": 1.0', b'"seconds": ' + number)
    assert number in payload
    with pytest.raises(ReportError) as raised:
        parse_report(payload)
    assert raised.value.reason == "invalid_field"


# -- the store and the exposition ---------------------------------------------------


def totals(steps: int, groups: Mapping[str, object] | None = None,
           **changes: object) -> bytes:
    """A report line with ``steps`` steps of 1 s each (bucket le=1.0) and ``groups``."""
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[6] = steps
    fields: dict[str, object] = {
        "steps": steps, "samples": steps * 32, "step_seconds": float(steps),
        "data_wait_seconds": 0.0, "step_buckets": buckets, "phase_seconds": {},
    }
    if groups is not None:
        fields["comm_groups"] = groups
    fields.update(changes)
    return line(**fields)


def accept(collector: TrainingCollector, body: bytes) -> None:
    response = collector.handle_push(push(body))
    assert response.status == 200, response.payload


#: The rank's labels: pushed from loopback by this test's own user, its job's owner.
RANK = {"job": "resnet50", "owner": uid_writer(os.geteuid()), "rank": "0"}
OWNER = RANK["owner"]


def test_each_group_becomes_its_series(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, {
        "dp": group(collectives=40, bytes=4096, seconds=2.0, exposed_seconds=0.5, seq=40,
                    root=1),
        "tp": group(collectives=960, bytes=1 << 30, seconds=4.0, exposed_seconds=None,
                    seq=959, root=None),
    }))
    accept(collector, totals(10, rank=1))  # measures no groups
    result = scrape(collector)

    dp, tp = {**RANK, "group": "dp"}, {**RANK, "group": "tp"}
    assert result.value("trainmon_training_group_collectives_total", **dp) == 40
    assert result.value("trainmon_training_group_collectives_total", **tp) == 960
    assert result.value("trainmon_training_group_comm_bytes_total", **dp) == 4096
    assert result.value("trainmon_training_group_comm_bytes_total", **tp) == 1 << 30
    assert result.value("trainmon_training_group_comm_seconds_total", **dp) == 2.0
    assert result.value("trainmon_training_group_comm_seconds_total", **tp) == 4.0
    # exposed time only where the client knows it: no sample for tp, never 0
    assert result.labelsets("trainmon_training_group_comm_exposed_seconds_total") == [dp]
    assert result.value("trainmon_training_group_comm_exposed_seconds_total", **dp) == 0.5
    assert result.series("trainmon_training_group_collective_seq",
                         "job", "owner", "rank", "group", "root") == {
        ("resnet50", OWNER, "0", "dp", "1"): 40.0,
        ("resnet50", OWNER, "0", "tp", ""): 959.0,  # root unknown
    }
    for name in GROUP_COUNTERS:
        assert f"# TYPE {name} counter" in result.text, name
        # the rank that reports no groups has no sample of any of them
        assert all(labels["rank"] == "0" for labels in result.labelsets(name)), name
    assert "# TYPE trainmon_training_group_collective_seq gauge" in result.text


def test_a_group_without_seq_has_no_seq_sample(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, {"dp": group(seq=None)}))
    result = scrape(collector)
    assert result.labelsets("trainmon_training_group_collective_seq") == []
    assert result.value("trainmon_training_group_collectives_total", group="dp", **RANK) == 40


def test_group_totals_grow_by_each_reports_increase(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, {"dp": group(collectives=40, bytes=400, seconds=1.0,
                                              exposed_seconds=0.25, seq=40)}))
    accept(collector, totals(20, {"dp": group(collectives=80, bytes=800, seconds=2.0,
                                              exposed_seconds=0.5, seq=80)}))
    accept(collector, totals(20, {"dp": group(collectives=80, bytes=800, seconds=2.0,
                                              exposed_seconds=0.5, seq=80)}))  # repeated
    result = scrape(collector)
    dp = {**RANK, "group": "dp"}
    assert result.value("trainmon_training_group_collectives_total", **dp) == 80
    assert result.value("trainmon_training_group_comm_bytes_total", **dp) == 800
    assert result.value("trainmon_training_group_comm_seconds_total", **dp) == 2.0
    assert result.value("trainmon_training_group_comm_exposed_seconds_total", **dp) == 0.5
    assert result.value("trainmon_training_group_collective_seq", **dp) == 80
    assert result.value("trainmon_training_reporter_resets_total", **RANK) == 0


def test_a_report_with_fewer_groups_keeps_the_others_and_counts_nothing_twice(
    make_collector: Make,
) -> None:
    collector = make_collector()
    accept(collector, totals(10, {"dp": group(collectives=40, seq=40, root=1),
                                  "tp": group(collectives=400, seq=400, root=0)}))
    accept(collector, totals(11, {"tp": group(collectives=440, seq=440, root=0)}))
    accept(collector, totals(12))  # no groups at all this time
    accept(collector, totals(13, {"dp": group(collectives=52, seq=52, root=1),
                                  "tp": group(collectives=520, seq=520, root=0)}))
    result = scrape(collector)
    assert result.series("trainmon_training_group_collectives_total",
                         "job", "owner", "rank", "group") == {
        ("resnet50", OWNER, "0", "dp"): 52.0, ("resnet50", OWNER, "0", "tp"): 520.0}
    assert result.series("trainmon_training_group_collective_seq",
                         "job", "owner", "rank", "group", "root") == {
        ("resnet50", OWNER, "0", "dp", "1"): 52.0, ("resnet50", OWNER, "0", "tp", "0"): 520.0}
    assert result.value("trainmon_training_reporter_resets_total", **RANK) == 0


def test_an_exposed_time_left_out_once_is_not_counted_twice(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, {"dp": group(seconds=1.0, exposed_seconds=0.5)}))
    accept(collector, totals(11, {"dp": group(seconds=1.5, exposed_seconds=None)}))
    accept(collector, totals(12, {"dp": group(seconds=2.0, exposed_seconds=0.75)}))
    result = scrape(collector)
    dp = {**RANK, "group": "dp"}
    assert result.value("trainmon_training_group_comm_seconds_total", **dp) == 2.0
    assert result.value("trainmon_training_group_comm_exposed_seconds_total", **dp) == 0.75


def test_group_totals_stay_monotonic_across_a_new_reporter(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, {"dp": group(collectives=40, bytes=400, seconds=1.0,
                                              exposed_seconds=0.25, seq=40, root=0),
                                  "pp": group(collectives=10, seq=10, root=0)},
                             reporter_id="first"))
    # the process restarted: its totals and sequence numbers start again
    accept(collector, totals(2, {"dp": group(collectives=8, bytes=80, seconds=0.5,
                                             exposed_seconds=0.125, seq=8, root=4)},
                             reporter_id="second"))
    accept(collector, totals(3, {"dp": group(collectives=12, bytes=120, seconds=0.75,
                                             exposed_seconds=0.25, seq=12, root=4)},
                             reporter_id="second"))
    result = scrape(collector)
    dp = {**RANK, "group": "dp"}
    assert result.value("trainmon_training_group_collectives_total", **dp) == 52
    assert result.value("trainmon_training_group_comm_bytes_total", **dp) == 520
    assert result.value("trainmon_training_group_comm_seconds_total", **dp) == 1.75
    assert result.value("trainmon_training_group_comm_exposed_seconds_total", **dp) == 0.5
    assert result.value("trainmon_training_group_collectives_total", group="pp", **RANK) == 10
    # seq and root are the new process's; the group it has not reported has none
    assert result.series("trainmon_training_group_collective_seq",
                         "job", "owner", "rank", "group", "root") == {
        ("resnet50", OWNER, "0", "dp", "4"): 12.0}
    assert result.value("trainmon_training_reporter_resets_total", **RANK) == 1


def test_a_group_going_backwards_for_one_reporter_is_a_reset(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, {"dp": group(collectives=40, seq=40)}))
    accept(collector, totals(11, {"dp": group(collectives=4, seq=4)}))  # same reporter
    result = scrape(collector)
    assert result.value("trainmon_training_group_collectives_total", group="dp", **RANK) == 44
    assert result.value("trainmon_training_group_collective_seq", group="dp", **RANK) == 4
    assert result.value("trainmon_training_reporter_resets_total", **RANK) == 1
    assert result.value("trainmon_training_steps_total", **RANK) == 21


def test_a_rank_holds_at_most_max_comm_groups(make_collector: Make) -> None:
    collector = make_collector()
    first = {f"a{index}": group() for index in range(MAX_COMM_GROUPS - 1)}
    accept(collector, totals(10, first))
    response = collector.handle_push(push(totals(11, {"b0": group(), "b1": group()},
                                                 reporter_id="other")))
    assert response.status == 400
    assert response.payload["error"] == "limit"
    accept(collector, totals(12, {"b0": group()}))  # the last one still fits
    result = scrape(collector)
    assert len(result.labelsets("trainmon_training_group_collectives_total")) == MAX_COMM_GROUPS
    assert result.value("trainmon_training_rejected_reports_total", reason="limit") == 1
    assert result.value("trainmon_training_steps_total", **RANK) == 12


def test_the_groups_go_with_the_expired_rank(make_collector: Make, clock: FakeClock) -> None:
    collector = make_collector(ttl_seconds=60.0)
    accept(collector, totals(10, {"dp": group()}))
    clock.advance(61.0)
    result = scrape(collector)
    for name in (*GROUP_COUNTERS, "trainmon_training_group_collective_seq"):
        assert result.labelsets(name) == [], name
