"""One run as ``trainmon runs`` and ``trainmon compare`` show it.

A run may have been seen by several nodes (a multi-node job): the local ledger
holds one ``RunRecord`` per node that saw it, and Prometheus one
``trainmon_training_run_info`` series per node. ``RunView`` merges them:
throughput and sample counts add up over the nodes (each node measured only its
own ranks), the mean step and the phase shares are weighted by each node's steps
(step percentiles cannot be merged from the nodes' and are left out), the
description is the first node's (every rank of a run describes the same run;
``host`` differs and is kept as the node set), the end reason the worst of the
nodes' (``trainmon.ledger.combined_end_reason``: crashed, preempted, lost,
stalled, finished), checkpoints add up and the last checkpoint is the latest, the
fail-slow changes are the nodes' together (each node names its own ranks; the largest
``MAX_RECORDED_FAIL_SLOW`` kept), and so are the profiles (``trainmon profile``: each
node records its own ranks'; the latest ``MAX_RECORDED_PROFILES`` kept, oldest first).

Coverage: ``ranks`` counts the ranks the records cover (each node's ledger
records only its own ranks). While it is below ``world_size`` the figures
are not the job's (``partial``): ``trainmon runs`` and ``compare`` say so
instead of letting one node's ledger read as the whole job.

A source that cannot tell some detail (a node daemon unreachable from the
Prometheus mode) says so in ``unavailable``, so that a comparison reports
"unknown" instead of inventing "no change".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainmon.ledger import combined_end_reason
from trainmon.ledger.goodput import goodput_ratio
from trainmon.ledger.summary import (
    MAX_RECORDED_FAIL_SLOW,
    MAX_RECORDED_PROFILES,
    fail_slow_entries,
    profile_entries,
)
from trainmon.training.protocol import redact_value

#: ``summary`` keys that add up over nodes.
ADDITIVE = ("samples_per_second", "samples_per_second_median", "samples_per_second_p10",
            "steps", "samples", "gpu_hours", "checkpoints")
#: ``summary`` keys averaged over nodes, weighted by their steps (exact: a mean of
#: means, or a share of step time, weighted by the steps).
WEIGHTED = ("step_seconds_mean", "data_wait_ratio", "comm_exposed_ratio")
#: ``summary`` keys no merge of nodes' figures can give (percentiles of steps the
#: records do not hold): the merged run has none, and readers show the mean step.
UNMERGEABLE = ("step_seconds_p50", "step_seconds_p95", "step_seconds_percentile_error")
#: The run's samples/s, best first: the exact job-wide rate (samples over the run's
#: active time), else the median of the rate buckets that older records carry.
THROUGHPUT_KEYS = ("samples_per_second", "samples_per_second_median")


class RecordLike(Protocol):
    """What ``RunView.from_records`` reads of a ``trainmon.ledger.RunRecord``."""

    @property
    def job(self) -> str: ...
    @property
    def run(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def config_hash(self) -> str: ...
    @property
    def started(self) -> float: ...
    @property
    def ended(self) -> float | None: ...
    @property
    def end_reason(self) -> str | None: ...
    @property
    def world_size(self) -> int | None: ...
    @property
    def ranks(self) -> int: ...
    @property
    def description(self) -> Mapping[str, object]: ...
    @property
    def summary(self) -> Mapping[str, object]: ...


@dataclass(frozen=True)
class RunView:
    """One run, merged over the nodes that saw it."""

    job: str
    run: str
    config_hash: str
    #: Unix seconds; ``ended`` None while running.
    started: float
    ended: float | None
    #: ``trainmon.ledger.END_REASONS`` (finished, crashed, preempted, lost, stalled) or
    #: None while running.
    end_reason: str | None
    #: Ranks in the job, as its processes said (None: unknown).
    world_size: int | None
    #: The nodes that saw the run, sorted.
    nodes: tuple[str, ...]
    #: The run description (config, environment, data_paths, versions, git,
    #: framework), or None when the source could not fetch it.
    description: Mapping[str, Any] | None
    #: The measured summary (``trainmon.ledger`` keys: samples_per_second_median...).
    summary: Mapping[str, Any]
    #: Where it came from: ``ledger`` or ``prometheus``.
    source: str = "ledger"
    #: Details the source could not tell, in words ("description: daemon X unreachable").
    unavailable: tuple[str, ...] = field(default=())
    #: Ranks the figures cover (summed over the nodes' records); None: unknown.
    ranks: int | None = None

    @property
    def partial(self) -> bool:
        """The figures cover fewer ranks than the job has (a per-node ledger)."""
        return (self.ranks is not None and self.world_size is not None
                and self.ranks < self.world_size)

    @classmethod
    def from_records(cls, records: Sequence[RecordLike], source: str = "ledger") -> RunView:
        """Merge one run's records (one per node); ``records`` must not be empty."""
        if not records:
            raise ValueError("a run view needs at least one record")
        first = min(records, key=lambda record: record.started)
        ended = [record.ended for record in records]
        running = any(end is None for end in ended)
        return cls(
            job=first.job,
            run=first.run,
            config_hash=first.config_hash,
            started=min(record.started for record in records),
            ended=None if running else max(e for e in ended if e),
            end_reason=None if running else combined_end_reason(
                record.end_reason for record in records),
            world_size=max((r.world_size for r in records if r.world_size is not None),
                           default=None),
            nodes=tuple(sorted({record.node for record in records})),
            description=redacted(first.description),
            summary=merge_summaries([record.summary for record in records]),
            source=source,
            ranks=sum(record.ranks for record in records),
        )

    @property
    def duration_seconds(self) -> float | None:
        value = self.summary.get("duration_seconds")
        if isinstance(value, (int, float)):
            return float(value)
        return None if self.ended is None else self.ended - self.started

    def to_json(self) -> dict[str, object]:
        return {
            "job": self.job,
            "run": self.run,
            "config_hash": self.config_hash,
            "started": self.started,
            "ended": self.ended,
            "end_reason": self.end_reason,
            "world_size": self.world_size,
            "ranks": self.ranks,
            "nodes": list(self.nodes),
            "description": None if self.description is None else dict(self.description),
            "summary": dict(self.summary),
            "source": self.source,
            "unavailable": list(self.unavailable),
        }


#: Description mappings whose secret-looking keys lose their values.
SECRET_BEARING = ("config", "environment", "framework", "versions")


def redacted(description: Mapping[str, Any]) -> dict[str, Any]:
    """``description`` with every secret-looking key's value replaced by ``<redacted>``
    and the redaction rule applied to every string value (``redact_value``).

    The client and the daemon redact already; this is the last line, for records
    written by an old or foreign client or an older daemon, before anything is printed.
    """
    clean = dict(description)
    for name in SECRET_BEARING:
        values = clean.get(name)
        if isinstance(values, Mapping):
            clean[name] = {key: redact_value(str(key), value) for key, value in values.items()}
    return clean


def number(value: object) -> float | None:
    """``value`` as a float when it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def samples_per_second(summary: Mapping[str, Any]) -> float | None:
    """The run's samples/s: its exact rate where the record has one, else the median of
    its rate buckets (``THROUGHPUT_KEYS``); None when neither is known."""
    for key in THROUGHPUT_KEYS:
        value = number(summary.get(key))
        if value is not None:
            return value
    return None


def throughput_key(*summaries: Mapping[str, Any]) -> str:
    """The first of ``THROUGHPUT_KEYS`` that every summary has (so that two runs are
    compared on one measure); the median's when they share none."""
    for key in THROUGHPUT_KEYS:
        if all(number(summary.get(key)) is not None for summary in summaries):
            return key
    return THROUGHPUT_KEYS[-1]


def merge_summaries(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One summary over several nodes' (a single one is returned as it is)."""
    if len(summaries) == 1:
        return dict(summaries[0])
    merged: dict[str, Any] = {}
    for key in ADDITIVE:
        values = [number(summary.get(key)) for summary in summaries]
        known = [value for value in values if value is not None]
        merged[key] = sum(known) if known else None
    weights = [number(summary.get("steps")) or 0.0 for summary in summaries]
    total_weight = sum(weights)
    for key in UNMERGEABLE:
        merged[key] = None
    for key in WEIGHTED:
        pairs = [(value, weight) for summary, weight in zip(summaries, weights, strict=True)
                 if (value := number(summary.get(key))) is not None]
        weight_sum = sum(weight for _, weight in pairs)
        if not pairs:
            merged[key] = None
        elif weight_sum > 0:
            merged[key] = sum(value * weight for value, weight in pairs) / weight_sum
        else:
            merged[key] = pairs[0][0]
    phases: dict[str, float] = {}
    verdicts: dict[str, float] = {}
    for summary, weight in zip(summaries, weights, strict=True):
        for name, share in dict(summary.get("phase_ratios") or {}).items():
            if number(share) is not None and total_weight > 0:
                phases[name] = phases.get(name, 0.0) + float(share) * weight / total_weight
        for kind, seconds in dict(summary.get("verdicts") or {}).items():
            if number(seconds) is not None:
                verdicts[kind] = max(verdicts.get(kind, 0.0), float(seconds))
    merged["phase_ratios"] = phases
    merged["verdicts"] = verdicts
    merged["final_verdict"] = _final_verdict(summaries)
    merged["last_checkpoint"] = max(
        (last for summary in summaries
         if isinstance(last := summary.get("last_checkpoint"), Mapping)
         and number(last.get("time")) is not None),
        key=lambda last: float(last["time"]), default=None)
    durations = [number(summary.get("duration_seconds")) for summary in summaries]
    merged["duration_seconds"] = max((d for d in durations if d is not None), default=None)
    merged["cost"] = _merged_cost(summaries, merged)
    gpu_seconds: dict[str, float] = {}
    for summary in summaries:
        for bucket, seconds in dict(summary.get("gpu_seconds") or {}).items():
            if number(seconds) is not None:
                gpu_seconds[bucket] = gpu_seconds.get(bucket, 0.0) + float(seconds)
    merged["gpu_seconds"] = gpu_seconds
    merged["goodput_ratio"] = goodput_ratio(gpu_seconds)
    merged["fail_slow"] = _merged_fail_slow(summaries)
    merged["profiles"] = _merged_profiles(summaries)
    return merged


def _merged_profiles(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, object]]:
    """The nodes' profiles (each of its own ranks; a profile seen twice once), the latest
    ``MAX_RECORDED_PROFILES``, oldest first."""
    profiles: dict[tuple[object, ...], dict[str, object]] = {}
    for summary in summaries:
        for entry in profile_entries(summary.get("profiles")):
            profiles.setdefault((entry["id"], entry["rank"], entry["time"]), entry)
    ordered = sorted(profiles.values(), key=lambda entry: number(entry["time"]) or 0.0)
    return ordered[-MAX_RECORDED_PROFILES:]


def _merged_fail_slow(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, object]]:
    """The nodes' fail-slow changes, the same change seen by two nodes once, the largest
    ``MAX_RECORDED_FAIL_SLOW`` by start."""
    changes: dict[tuple[object, ...], dict[str, object]] = {}
    for summary in summaries:
        for change in fail_slow_entries(summary.get("fail_slow")):
            key = (change["rank"], change["part"], change["start"])
            kept = changes.get(key)
            if kept is None or (number(change["ratio"]) or 0.0) > (number(kept["ratio"]) or 0.0):
                changes[key] = change
    largest = sorted(changes.values(), key=lambda change: number(change["ratio"]) or 0.0,
                     reverse=True)[:MAX_RECORDED_FAIL_SLOW]
    return sorted(largest, key=lambda change: number(change["start"]) or 0.0)


def _final_verdict(summaries: Sequence[Mapping[str, Any]]) -> str | None:
    """The final verdict most nodes ended with (ties: the first by name)."""
    counts: dict[str, int] = {}
    for summary in summaries:
        kind = summary.get("final_verdict")
        if isinstance(kind, str):
            counts[kind] = counts.get(kind, 0) + 1
    return min(counts, key=lambda kind: (-counts[kind], kind)) if counts else None


def _merged_cost(summaries: Sequence[Mapping[str, Any]], merged: Mapping[str, Any]
                 ) -> dict[str, Any] | None:
    costs = [summary.get("cost") for summary in summaries]
    if not costs or any(not isinstance(cost, Mapping) for cost in costs):
        return None
    currencies = {cost["currency"] for cost in costs if isinstance(cost, Mapping)}
    if len(currencies) != 1:
        return None
    total = sum(number(cost.get("total")) or 0.0 for cost in costs if isinstance(cost, Mapping))
    samples = number(merged.get("samples"))
    first = costs[0]
    assert isinstance(first, Mapping)
    return {
        "currency": first["currency"],
        "price_per_gpu_hour": first.get("price_per_gpu_hour"),
        "total": total,
        "per_million_samples": total / samples * 1e6 if samples else None,
    }
