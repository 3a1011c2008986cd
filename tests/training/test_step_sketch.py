"""The step-time sketch (``trainmon.training.sketch``): every quantile within 1 % of the
exact order statistic on random distributions (two modes, long tails), merges equal to
the sketch of the union, a bounded size whose coarser levels keep a bound on every
quantile, exact increases of a cumulative sketch, the wire form round-trips and hostile
wire input is refused with its reason."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable

import pytest

from trainmon.contract import (
    STEP_SKETCH_MAX_BUCKETS,
    STEP_SKETCH_MAX_SECONDS,
    STEP_SKETCH_MIN_SECONDS,
    STEP_SKETCH_RELATIVE_ACCURACY,
)
from trainmon.training.sketch import (
    MAX_LEVEL,
    StepSketch,
    covers,
    from_wire,
    increase,
    index_of,
    max_index,
    min_index,
    quantile,
    relative_accuracy,
    to_wire,
    value_of,
)

QUANTILES = (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
#: Float rounding at a bucket's edge: the bound is the accuracy, to a few ulps.
SLACK = 1e-9

Draw = Callable[[random.Random], float]
DISTRIBUTIONS: dict[str, Draw] = {
    "uniform 0.2-0.4 s": lambda r: r.uniform(0.2, 0.4),
    "lognormal around 0.3 s": lambda r: r.lognormvariate(math.log(0.3), 0.5),
    # the demo's two jobs in one: steps of 0.27 s and 0.44 s, 70/30
    "bimodal 0.27 / 0.44 s": lambda r: r.gauss(0.27, 0.01) if r.random() < 0.7
    else r.gauss(0.44, 0.015),
    # steady steps, one in fifty a checkpoint or evaluation step 40x longer
    "steady with 2 % slow steps": lambda r: r.gauss(0.3, 0.02) if r.random() < 0.98
    else r.uniform(8.0, 16.0),
    "pareto tail": lambda r: 0.1 * r.paretovariate(1.5),
    "microseconds": lambda r: r.uniform(2e-6, 9e-6),
}


def exact(durations: list[float], q: float) -> float:
    """The order statistic the sketch estimates: rank floor(q (n - 1)) of the sorted."""
    ordered = sorted(durations)
    return ordered[math.floor(q * (len(ordered) - 1))]


def sketch_of(durations: list[float]) -> StepSketch:
    sketch = StepSketch()
    for seconds in durations:
        sketch.add(seconds)
    return sketch


def worst_error(sketch: StepSketch, durations: list[float],
                quantiles: tuple[float, ...] = QUANTILES) -> float:
    """The largest relative error of the sketch's quantiles against the exact ones."""
    worst = 0.0
    for q in quantiles:
        truth = exact(durations, q)
        estimate = quantile(sketch, q)
        assert estimate is not None
        worst = max(worst, abs(estimate - truth) / truth)
    return worst


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_every_quantile_is_within_one_percent(name: str) -> None:
    draw = DISTRIBUTIONS[name]
    for seed in range(5):
        generator = random.Random(seed)
        durations = [draw(generator) for _ in range(20_000)]
        sketch = sketch_of(durations)

        assert sketch.total() == len(durations)
        assert sketch.level == 0 and len(sketch.counts) <= STEP_SKETCH_MAX_BUCKETS
        assert worst_error(sketch, durations) <= STEP_SKETCH_RELATIVE_ACCURACY + SLACK


def test_the_bimodal_median_is_the_mode_that_holds_it() -> None:
    """A histogram's midpoint lands between two modes; the sketch lands on the step."""
    durations = [0.27] * 700 + [0.44] * 300
    sketch = sketch_of(durations)

    p50, p95 = quantile(sketch, 0.5), quantile(sketch, 0.95)
    assert p50 is not None and p95 is not None
    assert abs(p50 / 0.27 - 1) <= STEP_SKETCH_RELATIVE_ACCURACY
    assert abs(p95 / 0.44 - 1) <= STEP_SKETCH_RELATIVE_ACCURACY


def test_an_empty_sketch_has_no_quantile() -> None:
    assert quantile(StepSketch(), 0.5) is None


def test_a_merge_is_the_sketch_of_the_union() -> None:
    generator = random.Random(7)
    ranks = [[generator.lognormvariate(math.log(0.25 + 0.05 * rank), 0.2)
              for _ in range(3000)] for rank in range(4)]
    merged = StepSketch()
    for durations in ranks:
        merged.merge(sketch_of(durations))

    union = [seconds for durations in ranks for seconds in durations]
    assert merged == sketch_of(union)
    assert worst_error(merged, union) <= STEP_SKETCH_RELATIVE_ACCURACY + SLACK


def test_a_merge_of_levels_is_at_the_coarser_one() -> None:
    generator = random.Random(8)
    wide = [10 ** generator.uniform(-4.0, 4.0) for _ in range(20_000)]
    narrow = [generator.gauss(0.3, 0.01) for _ in range(5_000)]
    coarse, fine = sketch_of(wide), sketch_of(narrow)
    assert (coarse.level, fine.level) == (2, 0)

    fine.merge(coarse)

    assert fine.level == 2 and fine == sketch_of(wide + narrow)
    assert worst_error(fine, wide + narrow) <= relative_accuracy(2) + SLACK


def test_out_of_range_durations_count_at_the_ends() -> None:
    lowest, highest = min_index(), max_index()
    assert index_of(0.0) == index_of(-1.0) == index_of(math.nan) == lowest
    assert index_of(1e-12) == index_of(STEP_SKETCH_MIN_SECONDS) == lowest
    assert index_of(math.inf) == index_of(1e12) == index_of(STEP_SKETCH_MAX_SECONDS) == highest
    sketch = sketch_of([0.0, -1.0, math.nan, 1e-12, math.inf, 1e12, 0.3])

    assert sketch.counts == {lowest: 4, highest: 2, index_of(0.3): 1}
    assert abs(value_of(lowest) / STEP_SKETCH_MIN_SECONDS - 1) <= 0.01
    assert abs(value_of(highest) / STEP_SKETCH_MAX_SECONDS - 1) <= 0.01


@pytest.mark.parametrize("name, durations", [
    # steady steps and slow ones spread over six decades (stalls of up to 11 days)
    ("slow outliers", lambda r: r.gauss(0.3, 0.03) if r.random() < 0.98
     else 10 ** r.uniform(0.0, 6.0)),
    # a tight loop: microseconds, and the scheduler's pauses of up to milliseconds
    ("tight loop", lambda r: 2e-6 * r.paretovariate(1.2)),
    # exponential, down to ten microseconds
    ("exponential", lambda r: 1e-5 + r.expovariate(20.0)),
    # steps spread evenly over eight decades
    ("log-uniform", lambda r: 10 ** r.uniform(-4.0, 4.0)),
])
def test_past_the_bound_every_quantile_keeps_its_levels_bound(
        name: str, durations: Callable[[random.Random], float]) -> None:
    """What a sketch collapsing one end would lose (the median of a tight loop folded
    into its pauses' range, an exponential's p99 into its bulk), a level up keeps, at
    the level's accuracy: 2 % at level 1."""
    for seed in range(3):
        generator = random.Random(seed)
        drawn = [durations(generator) for _ in range(50_000)]
        sketch = sketch_of(drawn)

        assert 1 <= sketch.level <= MAX_LEVEL, name
        assert len(sketch.counts) <= STEP_SKETCH_MAX_BUCKETS
        assert sketch.total() == len(drawn)
        # indifferent to the order of the steps
        assert sketch == sketch_of(sorted(drawn))
        assert worst_error(sketch, drawn) <= relative_accuracy(sketch.level) + SLACK


def test_levels_hold_the_bound_they_say() -> None:
    assert relative_accuracy(0) == pytest.approx(STEP_SKETCH_RELATIVE_ACCURACY)
    assert relative_accuracy(1) < 0.02 < relative_accuracy(2) < 0.04 < relative_accuracy(3)
    # the whole range fits at the last level: a sketch never outgrows it
    assert max_index(MAX_LEVEL) - min_index(MAX_LEVEL) < STEP_SKETCH_MAX_BUCKETS
    everything = sketch_of([10 ** (k / 100) for k in range(-600, 601)])
    assert everything.level == MAX_LEVEL and len(everything.counts) <= STEP_SKETCH_MAX_BUCKETS


def test_increases_of_a_cumulative_sketch_are_exact_across_levels() -> None:
    """What the training store and the run ledger do with a client's cumulative sketch:
    each report's increase over the previous one, summed, is the whole sketch, also
    when the client went up a level between two reports."""
    generator = random.Random(5)
    client = StepSketch()
    rebuilt = StepSketch()
    previous = StepSketch()
    levels = set()
    for report in range(40):
        for _ in range(500):
            client.add(10 ** generator.uniform(-3.0, 3.0) if report % 4 == 3
                       else generator.gauss(0.3, 0.02))
        now = client.copy()
        levels.add(now.level)
        assert covers(now, previous)
        grown = increase(now, previous)
        assert grown.total() == 500 and min(grown.counts.values()) > 0
        rebuilt.merge(grown)
        previous = now

    assert len(levels) >= 2
    assert rebuilt == client


def test_a_sketch_that_went_backwards_is_not_covered() -> None:
    older = StepSketch({10: 5, 20: 3})

    assert covers(StepSketch({10: 5, 20: 4}), older)
    assert not covers(StepSketch({10: 4, 20: 3}), older)  # a bucket lost steps: a restart
    assert not covers(StepSketch(), older)
    assert not covers(StepSketch({5: 8}, level=1), StepSketch({10: 8}, level=2))
    # a level up, bucket 10 is 5 and bucket 20 is 10
    assert covers(StepSketch({5: 5, 10: 3}, level=1), older)
    assert not covers(StepSketch({5: 8}, level=1), older)
    assert increase(StepSketch({10: 5, 20: 4}), older) == StepSketch({20: 1})
    assert increase(StepSketch({10: 7}), None) == StepSketch({10: 7})


def test_the_wire_form_round_trips() -> None:
    generator = random.Random(6)
    sketch = sketch_of([generator.expovariate(5.0) for _ in range(5000)] + [0.0, 1e9])

    sent = json.dumps(to_wire(sketch.counts))
    assert from_wire(json.loads(sent)) == sketch.counts
    # the client sends its dict as it is: JSON makes the keys strings
    assert from_wire(json.loads(json.dumps(sketch.counts))) == sketch.counts
    assert list(to_wire(sketch.counts)) == [str(index) for index in sorted(sketch.counts)]


def test_a_full_sketch_fits_in_a_few_kilobytes() -> None:
    lowest = min_index()
    full = {index: 2**53 for index in range(lowest, lowest + STEP_SKETCH_MAX_BUCKETS)}

    assert len(json.dumps(to_wire(full), separators=(",", ":"))) < 6_200


@pytest.mark.parametrize("value, reason", [
    ([1, 2], "must be an object"),
    ("{}", "must be an object"),
    (None, "must be an object"),
    ({"01": 1}, "not a decimal integer"),
    ({"+1": 1}, "not a decimal integer"),
    ({"-0": 1}, "not a decimal integer"),
    ({"1.0": 1}, "not a decimal integer"),
    ({" 1": 1}, "not a decimal integer"),
    ({"1_0": 1}, "not a decimal integer"),
    ({"1e3": 1}, "not a decimal integer"),
    ({"": 1}, "not a decimal integer"),
    ({"٣": 1}, "not a decimal integer"),  # int() takes other scripts' digits
    ({"9" * 5000: 1}, "not a decimal integer"),
    ({"1,2": 1}, "not a decimal integer"),
    ({"1": 1, "2,3": 1}, "not a decimal integer"),
    ({"1": 1, "2": 1, "03": 1}, "not a decimal integer"),
    ({str(min_index() - 1): 1}, "outside"),
    ({str(max_index() + 1): 1}, "outside"),
    ({"5": -1}, "count of bucket 5"),
    ({"5": 1.0}, "count of bucket 5"),
    ({"5": True}, "count of bucket 5"),
    ({"5": "1"}, "count of bucket 5"),
    ({"5": None}, "count of bucket 5"),
    ({"5": 2**53 + 1}, "count of bucket 5"),
    ({"5": {"6": 1}}, "count of bucket 5"),
])
def test_hostile_wire_input_is_refused_with_its_reason(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as refused:
        from_wire(value)
    assert not isinstance(refused.value, OverflowError)


def test_more_buckets_than_the_bound_is_an_overflow() -> None:
    oversized = {str(index): 1 for index in range(STEP_SKETCH_MAX_BUCKETS + 1)}

    with pytest.raises(OverflowError, match=f"more than {STEP_SKETCH_MAX_BUCKETS}"):
        from_wire(oversized)
    assert len(from_wire(dict(list(oversized.items())[:-1]))) == STEP_SKETCH_MAX_BUCKETS


def test_zero_counts_are_accepted_and_left_out() -> None:
    assert from_wire({"3": 0, "4": 2}) == {4: 2}


def test_a_sketch_from_any_counts_is_bounded() -> None:
    """``StepSketch(counts, level)`` (the store's copy of a report's) takes any counts:
    indices beyond the level's range count at its ends, more than the bound go up a
    level."""
    wide = {index: 1 for index in range(-2000, 2000, 3)}

    sketch = StepSketch(wide)

    assert len(sketch.counts) <= STEP_SKETCH_MAX_BUCKETS and sketch.level >= 1
    assert sketch.total() == sum(wide.values())
    assert min_index(sketch.level) <= min(sketch.counts)
    assert max(sketch.counts) <= max_index(sketch.level)
