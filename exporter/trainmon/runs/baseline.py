"""Which earlier run a run is measured against: ``trainmon doctor``'s "Run history".

A run is compared with the previous *comparable* run of its job in the node's
ledger. Comparable (``comparable``):

- the same job, and the same owner where both records know theirs (another
  user's run of a job of the same name is not this job's history; a record of
  the daemon's own writer, ``local``, such as the demo's seeded history, and
  one written before owners were kept belong to every owner);
- the same config hash (a changed config is a new benchmark, not a slowdown);
- the same world size, and the same ranks on this node: with the world size,
  the same number of nodes (a per-node ledger cannot see the other nodes, so
  the ranks it recorded stand for how the job was spread);
- started before it, ended, and with a rate (a run that crashed before its
  first measured interval has no samples/s and is skipped).

Among those, the newest that ended ``finished`` is the baseline. Only when
none did, the newest that ended otherwise (crashed, preempted, lost, stalled)
is taken, and the choice says so (``Baseline.finished`` False): a record keeps
one rate for the whole run, not its stretches, so the rate of such a run
includes the time before its end went wrong.

The regression share is ``contract.THROUGHPUT_REGRESSION_RATIO``, per rank
recorded (equal here, the ranks being the same). Beside the previous
comparable run, ``fastest`` finds the fastest comparable run that ended
within ``contract.THROUGHPUT_BEST_LOOKBACK_SECONDS``, the run the
``TrainmonThroughputRegression`` alert measures against: a slowdown that
came in gradually, run after run, or a baseline that is itself slow, still
shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainmon import contract
from trainmon.ledger import RunRecord
from trainmon.runs.view import number, samples_per_second, throughput_key
from trainmon.training.writers import LOCAL_WRITER


@dataclass(frozen=True)
class Baseline:
    """The run another is measured against, and why it was picked."""

    record: RunRecord
    #: It ended ``finished``; False: no comparable run finished, so the newest that
    #: ended otherwise (its whole-run rate).
    finished: bool


def rate(record: RunRecord) -> float | None:
    """The record's samples/s (exact where recorded, else the bucket median); None
    when it has none or it is zero."""
    value = samples_per_second(record.summary)
    return value if value else None


def comparable(current: RunRecord, candidate: RunRecord) -> bool:
    """``candidate`` may serve as ``current``'s baseline (module docstring)."""
    return (candidate.job == current.job
            and same_owner(candidate.owner, current.owner)
            and (candidate.run, candidate.node) != (current.run, current.node)
            and candidate.config_hash == current.config_hash
            and candidate.world_size == current.world_size
            and candidate.ranks == current.ranks
            and candidate.started < current.started
            and candidate.ended is not None and candidate.end_reason is not None
            and rate(candidate) is not None)


def same_owner(a: str, b: str) -> bool:
    """Two records' owners may be one writer's (an unknown or the daemon's own matches
    any)."""
    return a == b or bool({a, b} & {"", LOCAL_WRITER})


def choose_baseline(current: RunRecord, earlier: Iterable[RunRecord]) -> Baseline | None:
    """The newest comparable run of ``earlier`` that finished, else the newest
    comparable one that ended otherwise; None when none is comparable."""
    candidates = sorted((record for record in earlier if comparable(current, record)),
                        key=lambda record: record.started, reverse=True)
    finished = next((record for record in candidates if record.end_reason == "finished"),
                    None)
    if finished is not None:
        return Baseline(finished, True)
    return Baseline(candidates[0], False) if candidates else None


def fastest(current: RunRecord, earlier: Iterable[RunRecord], now: float,
            lookback: float = contract.THROUGHPUT_BEST_LOOKBACK_SECONDS) -> RunRecord | None:
    """The fastest comparable run of ``earlier`` that ended within ``lookback`` of
    ``now`` (ties: the newest); None without one."""
    found = [record for record in earlier if comparable(current, record)
             and record.ended is not None and record.ended >= now - lookback]
    return max(found, key=lambda record: (rate(record) or 0.0, record.started), default=None)


def change_ratio(current: RunRecord, reference: RunRecord) -> float | None:
    """``current``'s samples/s per rank recorded over ``reference``'s, less 1 (negative:
    slower); None when either has no rate."""
    key = throughput_key(current.summary, reference.summary)
    now, before = number(current.summary.get(key)), number(reference.summary.get(key))
    if not now or not before:
        return None
    return (now / max(current.ranks, 1)) / (before / max(reference.ranks, 1)) - 1


def slower(ratio: float | None, share: float = contract.THROUGHPUT_REGRESSION_RATIO) -> bool:
    """Slower by more than ``share`` (the regression threshold)."""
    return ratio is not None and ratio < -share
