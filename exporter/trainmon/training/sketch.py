"""Step-time sketch: percentiles of step durations within 1 % of the exact ones.

DDSketch (Masson, Rim, Lee, "DDSketch: A Fast and Fully-Mergeable Quantile Sketch
with Relative-Error Guarantees", VLDB 2019) in a few lines. With ``a`` the relative
accuracy (``contract.STEP_SKETCH_RELATIVE_ACCURACY``, 1 %) and
``gamma = (1 + a) / (1 - a)``, a step of ``x`` seconds counts in bucket
``i = ceil(log(x) / log(gamma))``, which holds the durations in
``(gamma^(i-1), gamma^i]``; the bucket's value ``2 gamma^i / (gamma + 1)`` is within
``a`` of each of them. A quantile ``q`` is the value of the bucket that holds the
duration of rank ``floor(q (n - 1))`` (0-based) of the ``n`` sorted ones, so it is
within 1 % of that duration, whatever the distribution (two modes, a long tail).
Durations below ``STEP_SKETCH_MIN_SECONDS`` count as that, above
``STEP_SKETCH_MAX_SECONDS`` as that.

A sketch maps bucket index to count (sparse: only non-empty buckets) and holds at
most ``STEP_SKETCH_MAX_BUCKETS`` of them. 256 buckets of 1 % span a factor of 167,
more than the steps of a job spread over, except for rare slow ones far out. Past the
bound the sketch does not drop an end, as DDSketch's collapsing stores do (which end:
the bulk of a job's steps is at the fast end and its rare slow steps at the other, a
tight loop's the other way round), but merges every pair of neighbouring buckets
into one (a *level* up: UDDSketch's uniform collapse, Epicoco et al. 2020): bucket
``i`` of level ``l`` becomes bucket ``ceil(i / 2)`` of level ``l + 1``, whose buckets
span ``gamma^(2^(l+1))``. Every quantile keeps a bound, 2 % at level 1 (a spread of
28 000 fits), 4 % at level 2, 8 % at level 3 (``MAX_LEVEL``: the whole range fits).
Counts stay exact, and a sketch's content does not depend on the order of its steps.

Sketches merge by adding their counts at the coarser level of the two
(``StepSketch.merge``), so a run's sketch is the sum of its ranks' increases. A
cumulative sketch (a client's, a rank's in the training store) only grows or goes
up a level, so ``increase`` (newer minus older, the older one brought to the newer's
level first) is exact. On the wire (docs/protocol.md, ``step_sketch`` and
``step_sketch_level``) a sketch is a JSON object of decimal indices to counts,
``{"-60": 310, "-59": 884}``, which ``from_wire`` checks, and its level.

Standard library only (and ``trainmon.contract``): the training-side client counts
its steps into a ``StepSketch``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from trainmon.contract import (
    STEP_SKETCH_MAX_BUCKETS,
    STEP_SKETCH_MAX_SECONDS,
    STEP_SKETCH_MIN_SECONDS,
    STEP_SKETCH_RELATIVE_ACCURACY,
)

#: The ratio of a level-0 bucket's upper bound to its lower one.
GAMMA = (1 + STEP_SKETCH_RELATIVE_ACCURACY) / (1 - STEP_SKETCH_RELATIVE_ACCURACY)
# log2: CPython's math.log is about three times as slow (it takes a base, and ints).
_INVERSE_LOG2_GAMMA = 1.0 / math.log2(GAMMA)
#: A count stays exactly representable as a float64 (``report_fields.MAX_COUNT``).
MAX_COUNT = 2**53
#: Longest index on the wire: a sign and four digits (``min_index(0)`` is -690).
_MAX_INDEX_TEXT = 5
#: Every index of a wire sketch, joined by commas: canonical decimal integers (no sign
#: on 0, no leading zero) of at most four digits, checked in one pass.
_INDEX_LIST = re.compile(r"(?:0|-?[1-9][0-9]{0,3})(?:,(?:0|-?[1-9][0-9]{0,3}))*")

_ceil = math.ceil
_log2 = math.log2


def _level_index(value: float, level: int) -> int:
    # the very product ``StepSketch.add`` takes (1 << level divides exactly)
    return _ceil(_log2(value) * (_INVERSE_LOG2_GAMMA / (1 << level)))


def min_index(level: int = 0) -> int:
    """The lowest bucket of ``level``: where ``STEP_SKETCH_MIN_SECONDS`` counts."""
    return _level_index(STEP_SKETCH_MIN_SECONDS, level)


def max_index(level: int = 0) -> int:
    """The highest bucket of ``level``: where ``STEP_SKETCH_MAX_SECONDS`` counts."""
    return _level_index(STEP_SKETCH_MAX_SECONDS, level)


def _max_level() -> int:
    level = 0
    while max_index(level) - min_index(level) + 1 > STEP_SKETCH_MAX_BUCKETS:
        level += 1
    return level


#: The coarsest level: the whole range of durations fits in the bound (3: 8 %).
MAX_LEVEL = _max_level()
#: The indices a wire sketch may hold, whatever its level.
_WIRE_RANGE = (min_index(0), max_index(0))


def relative_accuracy(level: int = 0) -> float:
    """The bound on a quantile's relative error at ``level`` (0.01 at level 0, then
    about 0.02, 0.04, 0.08)."""
    gamma = GAMMA ** (1 << level)
    return (gamma - 1.0) / (gamma + 1.0)


def index_of(seconds: float, level: int = 0) -> int:
    """The bucket of a step of ``seconds`` at ``level``, within its ``min_index`` ..
    ``max_index`` (0, a negative or NaN duration in the lowest, an infinite one in the
    highest)."""
    try:
        index = _level_index(seconds, level)
    except (ValueError, OverflowError):  # 0, negative, NaN, infinite
        return max_index(level) if seconds > 0 else min_index(level)
    return min(max(index, min_index(level)), max_index(level))


def value_of(index: int, level: int = 0) -> float:
    """The seconds bucket ``index`` of ``level`` stands for, within
    ``relative_accuracy(level)`` of each duration in it."""
    gamma = GAMMA ** (1 << level)
    return 2.0 * gamma ** index / (gamma + 1.0)


def coarsened(counts: Mapping[int, int], level: int, to_level: int) -> dict[int, int]:
    """``counts`` of ``level`` as the buckets of ``to_level`` (not below ``level``) hold
    them: bucket ``i`` goes to ``ceil(i / 2^(to_level - level))``."""
    if to_level <= level:
        return dict(counts)
    step = 1 << (to_level - level)
    moved: dict[int, int] = {}
    for index, count in counts.items():
        key = -(-index // step)  # ceil
        moved[key] = moved.get(key, 0) + count
    return moved


class StepSketch:
    """A bounded sketch of step durations: ``counts`` (bucket index -> steps) at
    ``level``. ``add`` counts one step (a log and a dict increment: the client calls
    it in ``Reporter.step()``), ``merge`` another sketch. Not thread-safe: the
    owner's lock guards it (and reads of ``counts``)."""

    __slots__ = ("_inverse", "counts", "level")

    def __init__(self, counts: Mapping[int, int] | None = None, level: int = 0) -> None:
        #: bucket index -> steps, at most ``STEP_SKETCH_MAX_BUCKETS`` of them.
        self.counts: dict[int, int] = {}
        #: 0: buckets of 1 %; each level up merged neighbouring pairs.
        self.level = 0
        self._inverse = _INVERSE_LOG2_GAMMA
        self._coarsen(min(max(level, 0), MAX_LEVEL))
        if not counts:
            return
        if (level == self.level and min(counts) >= min_index(level)
                and max(counts) <= max_index(level) and min(counts.values()) > 0):
            self.counts = dict(counts)  # a checked one (``from_wire``): nothing to move
            self._bound()
        else:
            self._add_counts(counts, level)

    def add(self, seconds: float) -> None:
        """Count one step of ``seconds`` (``index_of``'s bucket)."""
        try:
            index = _ceil(_log2(seconds) * self._inverse)
        except (ValueError, OverflowError):  # 0, negative, NaN, infinite
            index = max_index(self.level) if seconds > 0 else min_index(self.level)
        counts = self.counts
        count = counts.get(index)
        if count is not None:  # the usual path: a bucket seen before
            counts[index] = count + 1
        else:
            self._add_counts({index: 1}, self.level)

    def merge(self, other: StepSketch) -> None:
        """Add ``other``'s steps (at the coarser level of the two)."""
        self._add_counts(other.counts, other.level)

    def copy(self) -> StepSketch:
        copied = StepSketch(level=self.level)
        copied.counts = dict(self.counts)
        return copied

    def total(self) -> int:
        """The steps counted."""
        return sum(self.counts.values())

    def _add_counts(self, counts: Mapping[int, int], level: int) -> None:
        """Add ``counts`` of ``level`` (indices beyond the range count at its ends),
        then go up levels until the bound holds."""
        if level > self.level:
            self._coarsen(level)
        own = self.counts
        lowest, highest = min_index(self.level), max_index(self.level)
        if level < self.level:
            counts = coarsened(counts, level, self.level)
        if counts and (min(counts) < lowest or max(counts) > highest
                       or min(counts.values()) <= 0):  # rare: moved to the ends one by one
            moved: dict[int, int] = {}
            for index, count in counts.items():
                if count > 0:
                    key = lowest if index < lowest else highest if index > highest else index
                    moved[key] = moved.get(key, 0) + count
            counts = moved
        get = own.get
        for index, count in counts.items():
            own[index] = get(index, 0) + count
        self._bound()

    def _bound(self) -> None:
        """Go up levels until at most ``STEP_SKETCH_MAX_BUCKETS`` buckets are held."""
        while len(self.counts) > STEP_SKETCH_MAX_BUCKETS and self.level < MAX_LEVEL:
            self._coarsen(self.level + 1)

    def _coarsen(self, level: int) -> None:
        if level > self.level:
            self.counts = coarsened(self.counts, self.level, level)
            self.level = level
            self._inverse = _INVERSE_LOG2_GAMMA / (1 << level)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepSketch) and (self.level, self.counts) == (
            other.level, other.counts)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"StepSketch({self.counts!r}, level={self.level})"


def covers(newer: StepSketch, older: StepSketch) -> bool:
    """True when cumulative sketch ``newer`` holds at least ``older``'s steps in every
    bucket (``older`` brought to ``newer``'s level first); False when ``older`` is at a
    higher level (a sketch never goes down one)."""
    if older.level > newer.level:
        return False
    counts = newer.counts
    before = coarsened(older.counts, older.level, newer.level)
    # only the buckets that differ can fall short (a set difference, in C)
    return all(counts.get(index, 0) >= count for index, count in before.items() - counts.items())


def increase(newer: StepSketch, older: StepSketch | None) -> StepSketch:
    """The steps cumulative sketch ``newer`` counted since ``older`` (which it
    ``covers``), at ``newer``'s level; the empty buckets left out."""
    if older is None or not older.counts:
        return newer.copy()
    before = coarsened(older.counts, older.level, newer.level)
    get = before.get
    grown = {index: count - get(index, 0)  # the buckets that differ, found in C
             for index, count in newer.counts.items() - before.items()}
    return StepSketch({index: added for index, added in grown.items() if added > 0},
                      newer.level)


def quantile(sketch: StepSketch, q: float) -> float | None:
    """The ``q`` quantile (0-1) of the durations ``sketch`` holds, seconds: the value of
    the bucket holding the duration of rank ``floor(q (n - 1))``; None when empty."""
    counts = sketch.counts
    steps = sum(counts.values())
    if steps <= 0:
        return None
    rank = min(max(q, 0.0), 1.0) * (steps - 1)
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen > rank:
            return value_of(index, sketch.level)
    return value_of(max(counts), sketch.level)  # not reached: the last bucket ends the ranks


def to_wire(counts: Mapping[int, int]) -> dict[str, int]:
    """The JSON object of a sketch's counts, by increasing index."""
    return {str(index): counts[index] for index in sorted(counts)}


def from_wire(value: object, max_buckets: int = STEP_SKETCH_MAX_BUCKETS) -> dict[int, int]:
    """A sketch's counts as the wire carries them, checked: an object of at most
    ``max_buckets`` canonical decimal indices (no sign on 0, no leading zero) within
    level 0's range (``min_index(0)``..``max_index(0)``, which holds every level's) to
    integer counts (0 allowed and left out). Raises ``OverflowError`` past
    ``max_buckets`` entries and ``ValueError`` for anything else, with the reason."""
    if not isinstance(value, dict):
        raise ValueError("must be an object of bucket index to count")
    if len(value) > max_buckets:
        raise OverflowError(f"holds {len(value)} buckets, more than {max_buckets}")
    if not value:
        return {}
    lowest, highest = _WIRE_RANGE
    # the usual sketch, checked in a few passes in C; anything odd is looked at key by key
    keys, counts_sent = list(value), list(value.values())
    joined = ",".join(keys) if set(map(type, keys)) == {str} else ""
    if (_INDEX_LIST.fullmatch(joined) and joined.count(",") == len(keys) - 1
            and set(map(type, counts_sent)) == {int}):
        indices = list(map(int, keys))
        if (lowest <= min(indices) and max(indices) <= highest and min(counts_sent) > 0
                and max(counts_sent) <= MAX_COUNT):
            return dict(zip(indices, counts_sent, strict=True))
    counts: dict[int, int] = {}
    for key, count in value.items():
        index = _index(key)
        if not lowest <= index <= highest:
            raise ValueError(f"index {index} is outside {lowest}..{highest}")
        if type(count) is not int or not 0 <= count <= MAX_COUNT:
            raise ValueError(f"count of bucket {index} must be an integer within 0..2^53")
        if count:
            counts[index] = count
    return counts


def _index(key: object) -> int:
    """A wire index: the canonical decimal form of an integer, else ``ValueError``."""
    if isinstance(key, str) and 0 < len(key) <= _MAX_INDEX_TEXT:
        try:
            index = int(key)
        except ValueError:
            pass
        else:
            if str(index) == key:  # not "01", "+1", " 1", "1_0", "-0"
                return index
    raise ValueError(f"index {str(key)[:16]!r} is not a decimal integer")
