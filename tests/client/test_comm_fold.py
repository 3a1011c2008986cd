"""The one-pass fold of CPU rounds (``_fold_cpu_rounds``, what ``step()`` runs on a plain
DDP job) against the general fold (``_Timeline``), on random rounds: the same comm
seconds, exposed seconds, bytes and covered end, or no answer where it does not apply."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from trainmon.client.distributed import _fold_cpu_rounds, _Timeline

Round = list[list[Any]]


def _rounds(rng: random.Random) -> list[Round]:
    """Rounds of bucket records ``[launch, completion, bytes, closes the round, collective,
    sequence number]``,
    launches in order, completions overlapping each other and the next round's."""
    rounds: list[Round] = []
    clock = rng.uniform(0, 5)
    for _ in range(rng.randint(1, 4)):
        round_: Round = []
        for _ in range(rng.randint(1, 6)):
            clock += rng.choice((0.0, rng.uniform(0, 0.3)))
            round_.append([clock, clock + rng.uniform(0, 1.0), rng.randint(0, 1 << 20), False,
                           "all_reduce", len(round_) + 1])
        round_[-1][3] = True
        rounds.append(round_)
    return rounds


def _general(rounds: list[Round], clip: float) -> tuple[float, float, int, float]:
    timeline = _Timeline()
    for round_ in rounds:
        timeline.add_round([(r[0], r[1]) for r in round_])
    comm, exposed, covered = timeline.fold(clip)
    return comm, exposed, sum(r[2] for round_ in rounds for r in round_), covered


@pytest.mark.parametrize("seed", range(200))
def test_the_one_pass_fold_agrees_with_the_general_one(seed: int) -> None:
    rng = random.Random(seed)
    rounds = _rounds(rng)
    clip = rng.choice((-math.inf, float(rounds[0][0][0]) + rng.uniform(-0.5, 1.5)))
    records = [record for round_ in rounds for record in round_]
    fast = _fold_cpu_rounds(records, clip)
    assert fast is not None
    assert fast == pytest.approx(_general(rounds, clip), abs=1e-9)


def test_the_one_pass_fold_declines_what_it_cannot_fold() -> None:
    in_order = [[1.0, 2.0, 8, False, "all_reduce", 1], [1.5, 2.5, 8, True, "all_reduce", 2]]
    assert _fold_cpu_rounds(in_order, -math.inf) == pytest.approx((1.5, 1.0, 16, 2.5))
    assert _fold_cpu_rounds(list(reversed(in_order)), -math.inf) is None  # out of order
    assert _fold_cpu_rounds([[object(), 2.0, 8, True, "all_reduce", 1]], -math.inf) is None  # a CUDA event
