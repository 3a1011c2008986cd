"""What changed between two runs, and how their throughput moved: ``trainmon compare``.

Pure logic over two ``RunView`` s. The changes are the keys of everything a
run is described by:

- ``config``: the user's config keys (``Reporter(config=...)``), and the
  ``framework`` keys the Lightning / Hugging Face callbacks fill in;
- ``environment``: NCCL_*, TORCH_*, CUDA_*, OMP_* names (the run-id variables
  are identity, not configuration, and are left out);
- ``data``: the data paths and the kind of storage they live on, in words
  (local NVMe/disk → CFS/NFS...);
- ``versions``: ``versions.<name>`` (python, trainmon, torch, cuda, nccl);
- ``world_size``, ``nodes`` (the node set) and ``git.commit``.

Secrets: a value under a secret-looking name (``is_secret_name``) is never
shown, even when an old or foreign client sent it in clear; two redacted values
compare equal, and a redacted value against an absent one is "changed
(redacted)". A detail one side's source could not tell (its description is
unavailable) is listed in ``unavailable``, never reported as "no change".

Throughput change = b / a − 1 of the runs' samples/s: the exact rate
(``samples_per_second``: samples over the run's active time) when both
records carry it, else the median of their rate windows
(``samples_per_second_median``, records of older daemons), never one of each;
job-wide (``basis`` ``job``) when the figures of both runs cover all their
ranks; when either covers only part of its job (``RunView.partial``: a
per-node ledger), per rank (``per_rank``: samples/s over the ranks each figure
covers), so that one node's share never reads as the job slowing down. Step
time: the p50 and p95 where both records carry them, else the mean step
(``step_seconds_mean``), named as what it is.

The sentence says it in words, in this order: the throughput, then each
change (the variables that moved: "samples/s −18 % (1 210 → 992);
NCCL_IB_DISABLE 0 → 1; data moved from local NVMe/disk to CFS/NFS"), then
the step's shares that moved by 5 points or more (data wait, exposed
communication, each phase — one figure each: a phase that stands for
exposed communication is not said twice), then the goodput as a percentage
and the GPU-time losses that are not step shares (stalls, startup, redone
work...), then the cost, and last a run that did not finish cleanly ("run B
ended: crashed"). Between the cost and the ends, a fail-slow that one run had and
the other did not (``summary.fail_slow``: a rank or the job became slower during the
run and stayed slower): "run B slowed during the run, run A did not: rank 1 +35 %
compute (cpu_throttled) at 10:42 UTC"; when both had one, each run's largest. A
goodput that moved against the throughput is explained,
not cheered: "goodput 3 % → 12 % while samples/s fell 53 %: less time is lost
waiting, but each step got slower".

Profiles (``summary.profiles``: ``trainmon profile``) are no change between the runs
and stay out of the sentence: the text has a section with each run's latest profile
that has operators (``trainmon.runs.profiles``), "rank 0, 5 steps (1.20 s) at
2025-12-01 08:30 UTC: CPU aten::mm 41 %, aten::addmm 12 %, …; GPU …; trace …", and
``--json`` the runs' profiles and each latest one's top operators in words.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmon.ledger.goodput import BUCKETS
from trainmon.ledger.summary import fail_slow_entries
from trainmon.runs.profiles import latest_profile, operators_text, run_profiles
from trainmon.runs.timespec import utc_text
from trainmon.runs.view import RunView, number, throughput_key
from trainmon.terminal import duration_text
from trainmon.training.protocol import REDACTED, is_secret_name

#: Environment names that identify a run rather than configure it.
IDENTITY_ENVIRONMENT = frozenset({"TRAINMON_RUN_ID", "TORCHELASTIC_RUN_ID"})

#: ``trainmon.node.mounts`` storage kinds, in words.
STORAGE_WORDS = {
    "local_disk": "local NVMe/disk",
    "network_fs": "CFS/NFS",
    "cloud_disk": "cloud disk (CBS)",
    "object_store": "COS/object storage",
    "ephemeral": "tmpfs/container root",
    "unknown": "unknown storage",
}

#: Phase shares that moved by less than this (0-1) stay out of the sentence.
PHASE_SENTENCE_MIN_MOVE = 0.05
#: A throughput move smaller than this (0-1) is noise: a goodput move beside it needs no
#: explaining.
THROUGHPUT_NOISE = 0.05
#: Goodput buckets that are shares of the step as well (the step's data wait, exposed
#: communication and checkpoint phase): the sentence says them once, as step shares.
STEP_SHARE_BUCKETS = frozenset({"data_wait", "comm_exposed", "checkpoint"})
#: Changes named in the sentence before "and N more".
SENTENCE_MAX_CHANGES = 6
#: ``Comparison.throughput_basis``: job-wide figures, or per rank (module docstring).
THROUGHPUT_BASES = ("job", "per_rank")

Value = str | int | float | bool | None


@dataclass(frozen=True)
class Change:
    """One key whose value differs between run A and run B (None: absent)."""

    key: str
    #: ``config``, ``framework``, ``environment``, ``data``, ``versions``,
    #: ``world_size``, ``nodes`` or ``git``.
    kind: str
    a: Value
    b: Value
    #: The value is a secret: both sides show ``<redacted>``.
    redacted: bool = False

    def to_json(self) -> dict[str, object]:
        entry: dict[str, object] = {"key": self.key, "kind": self.kind, "a": self.a, "b": self.b}
        if self.redacted:
            entry["redacted"] = True
        return entry


@dataclass(frozen=True)
class Movement:
    """A measured number in both runs; ``change_ratio`` = b / a − 1 (None: unknown)."""

    a: float | None
    b: float | None

    @property
    def change_ratio(self) -> float | None:
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a - 1

    def to_json(self) -> dict[str, object]:
        ratio = self.change_ratio
        return {"a": self.a, "b": self.b,
                "change_ratio": None if ratio is None else round(ratio, 4)}


@dataclass(frozen=True)
class Comparison:
    a: RunView
    b: RunView
    changes: tuple[Change, ...]
    throughput: Movement
    #: The step time p50/p95, or both the mean step when either run lacks percentiles
    #: (``step_basis``).
    step_seconds_p50: Movement
    step_seconds_p95: Movement
    #: Phase shares (0-1) by name: ``data_wait``, ``comm_exposed`` and each phase.
    phases: Mapping[str, Movement]
    #: Cost per million samples, when both runs carry a cost in one currency.
    cost_per_million_samples: Movement | None
    currency: str | None
    #: Details that could not be compared, in words.
    unavailable: tuple[str, ...]
    summary: str
    #: What ``throughput`` compares: ``job`` or ``per_rank`` (``THROUGHPUT_BASES``).
    throughput_basis: str = "job"
    #: The summary key ``throughput`` compares: ``samples_per_second`` (exact) or
    #: ``samples_per_second_median``.
    throughput_key: str = "samples_per_second_median"
    #: ``percentiles`` (p50 and p95) or ``mean`` (both movements are the mean step).
    step_basis: str = "percentiles"
    #: The productive share of the runs' GPU-seconds (their ``goodput_ratio``).
    goodput: Movement = Movement(None, None)
    #: Each bucket of the goodput ledger but ``productive``: its share (0-1) of the runs'
    #: GPU-seconds, where either run has one.
    badput: Mapping[str, Movement] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        cost: dict[str, object] | None = None
        if self.cost_per_million_samples is not None:
            cost = {**self.cost_per_million_samples.to_json(), "currency": self.currency}
        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "changes": [change.to_json() for change in self.changes],
            "throughput": {**self.throughput.to_json(), "basis": self.throughput_basis,
                           "key": self.throughput_key},
            "step_seconds_p50": None if self.step_basis == "mean"
            else self.step_seconds_p50.to_json(),
            "step_seconds_p95": None if self.step_basis == "mean"
            else self.step_seconds_p95.to_json(),
            "step_seconds_mean": self.step_seconds_p50.to_json()
            if self.step_basis == "mean" else None,
            "phases": {name: movement.to_json() for name, movement in self.phases.items()},
            "goodput": self.goodput.to_json(),
            "badput": {name: movement.to_json() for name, movement in self.badput.items()},
            "cost_per_million_samples": cost,
            "fail_slow": {"a": fail_slow_changes(self.a.summary),
                          "b": fail_slow_changes(self.b.summary)},
            "profiles": {"a": run_profiles(self.a.summary),
                         "b": run_profiles(self.b.summary)},
            "top_operators": {"a": top_operators_json(self.a.summary),
                              "b": top_operators_json(self.b.summary)},
            "unavailable": list(self.unavailable),
            "summary": self.summary,
        }


def compare(a: RunView, b: RunView) -> Comparison:
    """Run A (the reference) against run B."""
    unavailable = [f"run {view.run}: {reason}" for view in (a, b) for reason in view.unavailable]
    changes: list[Change] = []
    if a.description is None or b.description is None:
        missing = [view.run for view in (a, b) if view.description is None]
        unavailable.append(
            f"configuration, environment, data paths, versions and git of run "
            f"{' and '.join(missing)} unknown: no description"
        )
    else:
        changes += _mapping_changes("config", a.description.get("config"),
                                    b.description.get("config"))
        changes += _mapping_changes("framework", a.description.get("framework"),
                                    b.description.get("framework"))
        changes += _mapping_changes("environment", a.description.get("environment"),
                                    b.description.get("environment"), skip=IDENTITY_ENVIRONMENT)
        changes += _data_changes(a.description.get("data_paths"), b.description.get("data_paths"))
        changes += _mapping_changes("versions", a.description.get("versions"),
                                    b.description.get("versions"), prefix="versions.")
        commit_a, commit_b = _git_commit(a.description), _git_commit(b.description)
        if commit_a != commit_b:
            changes.append(Change("git.commit", "git", commit_a, commit_b))
    if a.world_size != b.world_size:
        changes.append(Change("world_size", "world_size", a.world_size, b.world_size))
    if a.nodes != b.nodes:
        changes.append(Change("nodes", "nodes", ",".join(a.nodes), ",".join(b.nodes)))

    phases = _phases(a.summary, b.summary)
    cost, currency = _cost(a.summary, b.summary)
    key = throughput_key(a.summary, b.summary)
    throughput, basis = _throughput(a, b, key)
    p50, p95, step_basis = _steps(a.summary, b.summary)
    comparison = Comparison(
        a=a, b=b, changes=tuple(changes), throughput=throughput, throughput_basis=basis,
        throughput_key=key, step_seconds_p50=p50, step_seconds_p95=p95,
        step_basis=step_basis,
        phases=phases, cost_per_million_samples=cost, currency=currency,
        unavailable=tuple(unavailable), summary="",
        goodput=_movement(a.summary, b.summary, "goodput_ratio"),
        badput=_badput(a.summary, b.summary),
    )
    return Comparison(**{**comparison.__dict__, "summary": sentence(comparison)})


def _movement(a: Mapping[str, Any], b: Mapping[str, Any], key: str) -> Movement:
    return Movement(number(a.get(key)), number(b.get(key)))


def _throughput(a: RunView, b: RunView, key: str) -> tuple[Movement, str]:
    """The samples/s (``key``) of both runs: job-wide when neither covers only part of
    its job, else per rank covered."""
    if not a.partial and not b.partial:
        return _movement(a.summary, b.summary, key), "job"
    return Movement(per_rank(a, key), per_rank(b, key)), "per_rank"


def _steps(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Movement, Movement, str]:
    """Step time p50 and p95 of both runs, or (either lacking a p50) the mean step of
    both, twice."""
    p50 = _movement(a, b, "step_seconds_p50")
    if p50.a is not None and p50.b is not None:
        return p50, _movement(a, b, "step_seconds_p95"), "percentiles"
    mean = _movement(a, b, "step_seconds_mean")
    if mean.a is not None or mean.b is not None:
        return mean, mean, "mean"
    return p50, _movement(a, b, "step_seconds_p95"), "percentiles"


def per_rank(view: RunView, key: str = "samples_per_second_median") -> float | None:
    """samples/s (``key``) over the ranks the figure covers; None when either is
    unknown."""
    rate = number(view.summary.get(key))
    return None if rate is None or not view.ranks else rate / view.ranks


def coverage_text(view: RunView) -> str:
    """The ranks the figures cover: ``16`` (the whole job), ``8 of 16`` (part of it),
    ``8`` (world size unknown), ``-`` (unknown)."""
    if view.ranks is None:
        return "-" if view.world_size is None else f"? of {view.world_size}"
    if view.partial:
        return f"{view.ranks} of {view.world_size}"
    return str(view.ranks)


def count_text(count: int, noun: str) -> str:
    """``1 checkpoint``, ``3 checkpoints``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _mapping_changes(
    kind: str, a: object, b: object, *, prefix: str = "",
    skip: frozenset[str] = frozenset(),
) -> list[Change]:
    left = dict(a) if isinstance(a, Mapping) else {}
    right = dict(b) if isinstance(b, Mapping) else {}
    changes = []
    for key in sorted((left.keys() | right.keys()) - skip):
        in_a, in_b = key in left, key in right
        value_a, value_b = left.get(key), right.get(key)
        secret = (is_secret_name(str(key)) or value_a == REDACTED or value_b == REDACTED)
        if secret:
            if in_a == in_b and value_a == value_b:
                continue  # both redacted, or the same value: nothing to say
            changes.append(Change(prefix + str(key), kind, REDACTED if in_a else None,
                                  REDACTED if in_b else None, redacted=True))
        elif in_a != in_b or value_a != value_b:
            changes.append(Change(prefix + str(key), kind, _value(value_a), _value(value_b)))
    return changes


def _value(value: object) -> Value:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _data_changes(a: object, b: object) -> list[Change]:
    left, right = _data_text(a), _data_text(b)
    return [] if left == right else [Change("data", "data", left, right)]


def _data_entries(paths: object) -> list[Mapping[str, Any]]:
    if not isinstance(paths, Sequence) or isinstance(paths, str):
        return []
    entries: list[Mapping[str, Any]] = []
    for entry in paths:
        if isinstance(entry, Mapping):
            entries.append(entry)
        elif isinstance(entry, str):  # a description whose paths were not resolved
            entries.append({"path": entry, "storage": "unknown"})
    return entries


def _data_text(paths: object) -> str | None:
    """``/data/imagenet (CFS/NFS), /ckpt (local NVMe/disk)``; None without data paths."""
    entries = _data_entries(paths)
    if not entries:
        return None
    return ", ".join(
        f"{entry.get('path')} ({storage_words(entry.get('storage'))})"
        for entry in sorted(entries, key=lambda e: str(e.get("path")))
    )


def storage_words(kind: object) -> str:
    return STORAGE_WORDS.get(str(kind), str(kind)) if kind else STORAGE_WORDS["unknown"]


def _storages(paths: object) -> list[str]:
    return sorted({storage_words(entry.get("storage")) for entry in _data_entries(paths)})


def _git_commit(description: Mapping[str, Any]) -> str | None:
    git = description.get("git")
    if isinstance(git, Mapping) and isinstance(git.get("commit"), str):
        return str(git["commit"])
    return None


def _phases(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Movement]:
    phases = {
        "data_wait": _movement(a, b, "data_wait_ratio"),
        "comm_exposed": _movement(a, b, "comm_exposed_ratio"),
    }
    groups_a = dict(a.get("comm_exposed_ratio_by_group") or {})
    groups_b = dict(b.get("comm_exposed_ratio_by_group") or {})
    for name in sorted(groups_a.keys() | groups_b.keys()):
        phases[f"comm_exposed.{name}"] = Movement(number(groups_a.get(name)),
                                                  number(groups_b.get(name)))
    ratios_a = dict(a.get("phase_ratios") or {})
    ratios_b = dict(b.get("phase_ratios") or {})
    for name in sorted(ratios_a.keys() | ratios_b.keys()):
        phases[f"phase.{name}"] = Movement(number(ratios_a.get(name)), number(ratios_b.get(name)))
    return {name: m for name, m in phases.items() if m.a is not None or m.b is not None}


def _shares(summary: Mapping[str, Any]) -> dict[str, float]:
    """Each bucket's share of a run's GPU-seconds (``summary["gpu_seconds"]``)."""
    seconds = summary.get("gpu_seconds")
    if not isinstance(seconds, Mapping):
        return {}
    values = {str(name): seconds_of for name, raw in seconds.items()
              if (seconds_of := number(raw)) is not None}
    total = sum(values.values())
    return {name: value / total for name, value in values.items()} if total > 0 else {}


def _badput(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Movement]:
    shares_a, shares_b = _shares(a), _shares(b)
    if not shares_a and not shares_b:
        return {}
    return {name: Movement(shares_a.get(name), shares_b.get(name))
            for name in BUCKETS if name != "productive"
            and (shares_a.get(name) or shares_b.get(name))}


def _cost(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Movement | None, str | None]:
    cost_a, cost_b = a.get("cost"), b.get("cost")
    if not isinstance(cost_a, Mapping) or not isinstance(cost_b, Mapping):
        return None, None
    if cost_a.get("currency") != cost_b.get("currency"):
        return None, None
    return (Movement(number(cost_a.get("per_million_samples")),
                     number(cost_b.get("per_million_samples"))),
            str(cost_a.get("currency")))


# -- words ------------------------------------------------------------------


def sentence(comparison: Comparison) -> str:
    """The comparison in one line: throughput, changes, step shares, goodput, cost, ends
    (module docstring)."""
    parts = [_throughput_words(comparison)]
    change_words = [_change_words(change, comparison) for change in comparison.changes]
    if len(change_words) > SENTENCE_MAX_CHANGES:
        extra = len(change_words) - SENTENCE_MAX_CHANGES
        change_words = [*change_words[:SENTENCE_MAX_CHANGES], f"and {extra} more changes"]
    if change_words:
        parts += change_words
    elif comparison.unavailable:
        parts.append("what changed is unknown (no description of one run)")
    else:
        parts.append("no recorded change in configuration, environment, data, versions, "
                     "world size or nodes")
    for name, movement in sentence_phases(comparison).items():
        assert movement.a is not None and movement.b is not None
        parts.append(f"{phase_words(name).strip()} {percent(movement.a)} → "
                     f"{percent(movement.b)}")
    parts += _goodput_words(comparison)
    if comparison.cost_per_million_samples is not None:
        cost = comparison.cost_per_million_samples
        if cost.a is not None and cost.b is not None:
            parts.append(f"cost per million samples {money(cost.a)} → {money(cost.b)} "
                         f"{comparison.currency}")
    parts += _fail_slow_words(comparison)
    for label, view in (("A", comparison.a), ("B", comparison.b)):
        if view.end_reason not in (None, "finished"):
            parts.append(f"run {label} ended: {view.end_reason}")
    return "; ".join(parts)


def sentence_phases(comparison: Comparison) -> dict[str, Movement]:
    """The step shares the sentence names: known in both runs, moved by
    ``PHASE_SENTENCE_MIN_MOVE`` or more; the ``comm`` phase left out when the exposed
    communication is measured, which it stands in for otherwise (one figure each)."""
    moved = {name: movement for name, movement in comparison.phases.items()
             if movement.a is not None and movement.b is not None
             and abs(movement.b - movement.a) >= PHASE_SENTENCE_MIN_MOVE}
    if "comm_exposed" in comparison.phases:
        moved.pop("phase.comm", None)
    return moved


def loss_buckets(comparison: Comparison) -> dict[str, Movement]:
    """The GPU-time losses beside the goodput that are not step shares (stalls, startup,
    redone work, idle GPUs, waiting for a straggler...): the step shares are said as
    such, once."""
    return {name: movement for name, movement in comparison.badput.items()
            if name not in STEP_SHARE_BUCKETS}


def _goodput_words(comparison: Comparison) -> list[str]:
    """``goodput 62 % → 81 %``, explained when it moved against the throughput, and the
    other losses that moved by 5 points or more."""
    goodput = comparison.goodput
    if goodput.a is None or goodput.b is None:
        return []
    text = f"goodput {percent(goodput.a)} → {percent(goodput.b)}"
    move = goodput.b - goodput.a
    ratio = comparison.throughput.change_ratio
    if ratio is not None and abs(move) >= PHASE_SENTENCE_MIN_MOVE and abs(ratio) >= (
            THROUGHPUT_NOISE):
        amount = f"{abs(round(ratio * 100))} %"
        if move > 0 and ratio < 0:
            text += (f" while samples/s fell {amount}: less time is lost waiting, but each "
                     "step got slower")
        elif move < 0 and ratio > 0:
            text += (f" while samples/s rose {amount}: each step got faster, but more time "
                     "is lost waiting")
    words = [text]
    for name, movement in loss_buckets(comparison).items():
        change = (movement.b or 0.0) - (movement.a or 0.0)
        if abs(change) >= PHASE_SENTENCE_MIN_MOVE:
            words.append(f"{name} {signed_points(change)} of the GPU time")
    return words


def _throughput_words(comparison: Comparison) -> str:
    movement = comparison.throughput
    name = "samples/s" if comparison.throughput_basis == "job" else "samples/s per rank"
    ratio = movement.change_ratio
    change = "unknown" if ratio is None else signed_percent(ratio)
    figures = f"{quantity(movement.a)} → {quantity(movement.b)}"
    coverage = [f"run {label}: {view.ranks} of {view.world_size} ranks recorded"
                for label, view in (("A", comparison.a), ("B", comparison.b)) if view.partial]
    return f"{name} {change} ({'; '.join([figures, *coverage])})"


def _change_words(change: Change, comparison: Comparison) -> str:
    if change.redacted:
        return f"{change.key} changed (redacted)"
    if change.kind == "data" and comparison.a.description and comparison.b.description:
        before = _storages(comparison.a.description.get("data_paths"))
        after = _storages(comparison.b.description.get("data_paths"))
        if before and after and before != after:
            return f"data moved from {' + '.join(before)} to {' + '.join(after)}"
        return f"data {change.a or 'none'} → {change.b or 'none'}"
    if change.a is None:
        return f"{change.key} set to {change.b}"
    if change.b is None:
        return f"{change.key} {change.a} unset"
    return f"{change.key} {change.a} → {change.b}"


def fail_slow_changes(summary: Mapping[str, Any]) -> list[dict[str, object]]:
    """The run's fail-slow changes (``summary.fail_slow``, each checked), by start; []
    for none (or a record of an older daemon)."""
    return fail_slow_entries(summary.get("fail_slow"))


def largest_fail_slow(summary: Mapping[str, Any]) -> dict[str, object] | None:
    """The run's largest fail-slow change (the first by start among equals); None."""
    changes = fail_slow_changes(summary)
    return max(changes, key=lambda change: number(change["ratio"]) or 0.0) if changes else None


def fail_slow_text(change: Mapping[str, object], *, held: bool = False) -> str:
    """``rank 1 +35 % compute (cpu_throttled) at 10:42 UTC`` (``the job`` for rank "");
    ``held``: and ``for 12m30s``, how long the evaluations saw it."""
    rank = str(change.get("rank", ""))
    who = f"rank {rank}" if rank else "the job"
    ratio = number(change.get("ratio")) or 0.0
    start = number(change.get("start"))
    at = "" if not start else " at " + time.strftime("%H:%M UTC", time.gmtime(start))
    text = (f"{who} {signed_percent(ratio)} {change.get('part', '')} "
            f"({change.get('cause', '') or 'unknown'}){at}")
    if held:
        text += f" for {duration_text(number(change.get('seconds')), unknown='?')}"
    return text


def _fail_slow_words(comparison: Comparison) -> list[str]:
    """Which run slowed during the run and how (module docstring); [] when neither did."""
    a, b = (largest_fail_slow(view.summary) for view in (comparison.a, comparison.b))
    if a is None and b is None:
        return []
    if a is not None and b is not None:
        return [f"both runs slowed during the run (A: {fail_slow_text(a)}; "
                f"B: {fail_slow_text(b)})"]
    slowed, other = ("A", "B") if a is not None else ("B", "A")
    change = a if a is not None else b
    assert change is not None
    return [f"run {slowed} slowed during the run, run {other} did not: "
            f"{fail_slow_text(change)}"]


def top_operators_json(summary: Mapping[str, Any]) -> dict[str, object] | None:
    """The run's latest profile with operators: its ``id``, ``rank`` and ``time`` and
    its top operators in words (``cpu``, ``device``: None without GPU operators); None
    without such a profile."""
    entry = latest_profile(summary)
    if entry is None:
        return None
    return {"id": entry["id"], "rank": entry["rank"], "time": entry["time"],
            "cpu": operators_text(entry["top_cpu"]) if entry["top_cpu"] else None,
            "device": operators_text(entry["top_device"]) if entry["top_device"] else None}


def profile_text(summary: Mapping[str, Any]) -> str | None:
    """The run's latest profile with operators, ``rank 0, 5 steps (1.20 s) at 2025-12-01
    08:30 UTC: CPU aten::mm 41 %, …; GPU aten::mm 52 %, …; trace /var/lib/...``; when
    every profile of the run failed, the latest failure; None without a profile."""
    entry = latest_profile(summary)
    if entry is None:
        profiles = run_profiles(summary)
        if not profiles:
            return None
        failed = profiles[-1]
        return (f"rank {failed['rank']} at {utc_text(number(failed['time']) or 0.0)}: "
                f"failed: {failed['error'] or 'no operators recorded'}")
    steps = int(number(entry["steps"]) or 0)
    text = (f"rank {entry['rank']}, {count_text(steps, 'step')} "
            f"({number(entry['seconds']) or 0.0:.2f} s) at "
            f"{utc_text(number(entry['time']) or 0.0)}: CPU {operators_text(entry['top_cpu'])}")
    if entry["top_device"]:
        text += f"; GPU {operators_text(entry['top_device'])}"
    if entry["trace"]:
        text += f"; trace {entry['trace']}"
    return text


def phase_words(name: str) -> str:
    if name == "data_wait":
        return "data wait"
    if name == "comm_exposed":
        return "exposed comm"
    if name.startswith("comm_exposed."):  # one parallelism dimension's share
        return f"  in {name.removeprefix('comm_exposed.')}"
    return f"{name.removeprefix('phase.')} phase"


def signed_percent(ratio: float) -> str:
    """``-0.183`` → ``−18 %``, ``0.05`` → ``+5 %``."""
    value = round(ratio * 100)
    if value == 0:
        return "±0 %"
    return f"{'+' if value > 0 else '−'}{abs(value)} %"


def signed_points(move: float) -> str:
    """A share's move in percentage points: ``-0.183`` → ``−18 points``."""
    value = round(move * 100)
    return f"{'+' if value > 0 else '−'}{abs(value)} points"


def percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def quantity(value: float | None) -> str:
    """``1210.4`` → ``1 210``, ``99.46`` → ``99.5``, ``0.1234`` → ``0.123``; None → ``?``."""
    if value is None:
        return "?"
    if abs(value) >= 100:
        return f"{value:,.0f}".replace(",", " ")
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def money(value: float) -> str:
    return f"{value:,.2f}".replace(",", " ")
