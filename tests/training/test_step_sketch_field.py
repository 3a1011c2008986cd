"""The report's step sketch (``step_sketch``, ``step_sketch_level``; docs/protocol.md):
a real client sends it adding up to its steps, the daemon refuses a malformed or
oversized one with its reason and counts it, a client without it keeps working, and
the training store keeps each rank's cumulative sketch as it keeps ``step_buckets``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import scrape
from tests.training.training_support import push, report
from trainmon.client import Reporter
from trainmon.collectors.training import TrainingCollector
from trainmon.contract import STEP_SKETCH_MAX_BUCKETS
from trainmon.training.protocol import (
    MAX_LINE_BYTES,
    ReportError,
    encode_report,
    parse_report,
)
from trainmon.training.report_fields import (
    DEFAULT_MAX_LABEL_LENGTH,
    MAX_PATH_BYTES,
    MAX_PHASES,
    REPORT_FIELDS,
    build_report,
)
from trainmon.training.sketch import MAX_LEVEL, StepSketch, index_of, min_index, quantile

Make = Callable[..., TrainingCollector]
RANK = {"job": "resnet50", "rank": "0"}


def sketched(steps: int, sketch: dict[str, int], level: int | None = None,
             **changes: object) -> dict[str, object]:
    """A report of ``steps`` steps (all in the histogram's fifth bucket) with ``sketch``."""
    buckets = list(report()["step_buckets"])  # type: ignore[call-overload]
    buckets[4] = steps
    fields = report(steps=steps, samples=32 * steps, step_seconds=0.2 * steps,
                    data_wait_seconds=0.0, step_buckets=buckets, step_sketch=sketch, **changes)
    if level is not None:
        fields["step_sketch_level"] = level
    return fields


def body(fields: dict[str, object]) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def test_a_client_sends_a_sketch_of_every_step(tmp_path: Path) -> None:
    with Reporter("sketch-job", rank=0, world_size=1, environ={},
                  endpoint=f"unix://{tmp_path}/none.sock") as reporter:
        reporter.step(8)  # from construction: not timed here
        durations = []
        started = time.perf_counter()
        for pause in (0.02, 0.04, 0.04, 0.08, 0.04):
            time.sleep(pause)
            reporter.step(8)
            now = time.perf_counter()
            durations.append(now - started)
            started = now
        sent = reporter.report()

    parsed = parse_report(encode_report(sent))

    assert parsed.step_sketch_level == 0
    assert parsed.step_sketch is not None and sum(parsed.step_sketch.values()) == 6
    # each step in the bucket of its duration as the loop measured it (or the next: the
    # two clocks read microseconds apart)
    for seconds in durations:
        assert any(abs(index - index_of(seconds)) <= 1 for index in parsed.step_sketch)
    longest = quantile(StepSketch(parsed.step_sketch), 1.0)
    assert longest is not None and abs(longest / max(durations) - 1) < 0.02


def test_an_old_client_without_the_sketch_is_accepted(make_collector: Make) -> None:
    collector = make_collector()

    response = collector.handle_push(push(body(report())))

    assert response.status == 200, response.payload
    parsed = parse_report(body(report()).rstrip(b"\n"))
    assert (parsed.step_sketch, parsed.step_sketch_level) == (None, None)
    [rank] = collector.store.snapshot().ranks
    assert rank.totals.steps == 10 and rank.totals.step_sketch is None
    assert scrape(collector).value("trainmon_training_steps_total", **RANK) == 10


def test_the_level_defaults_to_zero_with_a_sketch() -> None:
    parsed = parse_report(body(sketched(10, {"-50": 10})).rstrip(b"\n"))

    assert (parsed.step_sketch, parsed.step_sketch_level) == ({-50: 10}, 0)


@pytest.mark.parametrize("changes, reason, detail", [
    ({"step_sketch": [1, 2]}, "invalid_field", "step_sketch: must be an object"),
    ({"step_sketch": {"-50": 9}}, "invalid_field", "step_sketch must add up to steps"),
    ({"step_sketch": {"-50": 11}}, "invalid_field", "step_sketch must add up to steps"),
    ({"step_sketch": {"-050": 10}}, "invalid_field", "is not a decimal integer"),
    ({"step_sketch": {"x": 10}}, "invalid_field", "is not a decimal integer"),
    ({"step_sketch": {"-50": 10.0}}, "invalid_field", "count of bucket -50"),
    ({"step_sketch": {"-50": -1, "-49": 11}}, "invalid_field", "count of bucket -50"),
    ({"step_sketch": {"99999": 10}}, "invalid_field", "outside"),
    ({"step_sketch_level": MAX_LEVEL + 1}, "invalid_field", "step_sketch_level must be"),
    ({"step_sketch_level": -1}, "invalid_field", "step_sketch_level must be"),
    ({"step_sketch_level": True}, "invalid_field", "step_sketch_level must be an integer"),
    ({"step_sketch": None, "step_sketch_level": 1}, "invalid_field",
     "step_sketch_level need step_sketch"),
    ({"step_sketch": {str(index): 1 for index in range(STEP_SKETCH_MAX_BUCKETS + 1)},
      "steps": STEP_SKETCH_MAX_BUCKETS + 1}, "limit", "more than 256"),
])
def test_a_malformed_or_oversized_sketch_is_refused_and_counted(
        make_collector: Make, changes: dict[str, object], reason: str, detail: str) -> None:
    fields = {**sketched(10, {"-50": 10}), **changes}
    if "steps" in changes:  # keep the other counts consistent with it
        buckets = [0] * len(fields["step_buckets"])  # type: ignore[arg-type]
        buckets[4] = fields["steps"]  # type: ignore[call-overload]
        fields["step_buckets"] = buckets
    with pytest.raises(ReportError) as refused:
        parse_report(body(fields).rstrip(b"\n"))
    assert refused.value.reason == reason
    assert detail in refused.value.detail

    collector = make_collector()
    response = collector.handle_push(push(body(fields)))

    assert response.status == 400
    assert response.payload["error"] == reason
    result = scrape(collector)
    assert result.value("trainmon_training_rejected_reports_total", reason=reason) == 1
    assert result.value("trainmon_training_steps_total", **RANK) is None  # nothing taken


def test_a_report_with_a_full_sketch_still_fits_in_a_line() -> None:
    """The longest report a client can build: every phase with a name of the longest
    label, a checkpoint path of PATH_MAX (ASCII), every sketch bucket with a count near
    the protocol's largest."""
    values = {spec.name: report().get(spec.name) for spec in REPORT_FIELDS}
    lowest = min_index()
    sketch = {index: 2**44 for index in range(lowest, lowest + STEP_SKETCH_MAX_BUCKETS)}
    steps = sum(sketch.values())
    values.update(
        steps=steps, samples=steps, step_seconds=1e15, step_buckets=[0] * 14 + [steps],
        step_sketch=sketch, step_sketch_level=0,
        phase_seconds={f"{index:02d}" + "p" * (DEFAULT_MAX_LABEL_LENGTH - 2): 1e15
                       for index in range(MAX_PHASES)},
        checkpoints=1, checkpoint_seconds=1.0, last_checkpoint_time=1_700_000_000.0,
        checkpoint_path="/" + "c" * (MAX_PATH_BYTES - 1),
    )

    line = encode_report(build_report(values))

    assert len(line) - 1 <= MAX_LINE_BYTES
    assert parse_report(line.rstrip(b"\n")).step_sketch == sketch


def test_the_store_keeps_each_ranks_cumulative_sketch(make_collector: Make) -> None:
    """Like ``step_buckets``: each report adds its increase over the same reporter's
    previous one (also when the client went up a level between them), a restarted
    reporter adds its whole sketch, a report that lacks it neither resets nor adds."""
    collector = make_collector()

    def accept(fields: dict[str, object]) -> None:
        response = collector.handle_push(push(body(fields)))
        assert response.status == 200, response.payload

    def kept() -> StepSketch:
        [rank] = collector.store.snapshot().ranks
        assert rank.totals.step_sketch is not None
        return rank.totals.step_sketch

    accept(sketched(10, {"-60": 4, "-59": 6}))
    accept(sketched(12, {"-60": 5, "-59": 6, "-40": 1}))
    assert kept() == StepSketch({-60: 5, -59: 6, -40: 1})
    # the client went up a level: -60 is -30 there, -59 is -29 (ceil(-29.5)), -40 is -20
    accept(sketched(14, {"-30": 5, "-29": 7, "-20": 2}, level=1))
    assert kept() == StepSketch({-30: 5, -29: 7, -20: 2}, level=1)
    accept({**sketched(15, {}), "step_sketch": None})  # an odd report without it
    assert kept().total() == 14
    accept(sketched(16, {"-30": 5, "-29": 8, "-20": 3}, level=1))
    assert kept() == StepSketch({-30: 5, -29: 8, -20: 3}, level=1)
    accept(sketched(3, {"-60": 3}, reporter_id="restarted1"))  # level 0 again: a new process
    assert kept() == StepSketch({-30: 8, -29: 8, -20: 3}, level=1)
    [rank] = collector.store.snapshot().ranks
    assert rank.totals.steps == 16 + 3


def test_only_the_latest_reporters_of_a_rank_keep_their_sketch(make_collector: Make) -> None:
    """Memory: a rank keeps the sketches of its two latest reporters. Two processes
    claiming one rank still add up; a third one's return adds its whole sketch again,
    so the rank's sketch no longer matches its steps (and its run shows no step
    percentiles) instead of the store holding a sketch per remembered reporter."""
    collector = make_collector()

    def accept(fields: dict[str, object]) -> None:
        response = collector.handle_push(push(body(fields)))
        assert response.status == 200, response.payload

    def totals() -> tuple[int, int]:
        [rank] = collector.store.snapshot().ranks
        assert rank.totals.step_sketch is not None
        return rank.totals.steps, rank.totals.step_sketch.total()

    accept(sketched(10, {"-60": 10}, reporter_id="first"))
    accept(sketched(5, {"-50": 5}, reporter_id="second"))
    accept(sketched(12, {"-60": 12}, reporter_id="first"))  # two alternate: still exact
    assert totals() == (17, 17)
    accept(sketched(3, {"-40": 3}, reporter_id="third"))  # "second" is the third latest
    accept(sketched(13, {"-60": 13}, reporter_id="first"))
    assert totals() == (21, 21)
    accept(sketched(7, {"-50": 7}, reporter_id="second"))  # its sketch was let go
    assert totals() == (23, 21 + 7)
