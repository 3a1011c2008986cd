"""The text of ``trainmon runs`` (a table, newest first) and ``trainmon compare``
(the sentence first, then the changes and the measured numbers side by side).

``RANKS`` is the ranks the figures cover: the job's world size when they
cover all of it, ``8 of 16`` when only part of it (a per-node ledger; a note
under the table says so). ``FAIL-SLOW``, when a run of the table had one: its largest
change (``rank 1 +35 % compute``, ``+2 more``), the others and their causes in
``compare``. ``compare`` shows each run's latest profile (``trainmon profile``: its top
operators on the CPU and the GPU, ``trainmon.runs.profiles``) under ``profiles``, when
either run has one. Every cell and line goes through
``trainmon.terminal.one_line``: what a record says (a job name, a config
value) cannot reach the terminal as an escape sequence or start a line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainmon.runs.compare import (
    Comparison,
    Movement,
    count_text,
    coverage_text,
    fail_slow_changes,
    fail_slow_text,
    largest_fail_slow,
    loss_buckets,
    money,
    percent,
    phase_words,
    profile_text,
    quantity,
    signed_percent,
    storage_words,
)
from trainmon.runs.timespec import utc_text
from trainmon.runs.view import RunView, number, samples_per_second
from trainmon.terminal import duration_text, one_line

RUNS_HEADER = ("RUN", "JOB", "STARTED", "DURATION", "RANKS", "SAMPLES/S", "STEP P50", "VERDICT",
               "GOODPUT", "LARGEST LOSS", "END")
#: Under the table when a run's figures cover only part of its job.
PARTIAL_NOTE = ("N of M ranks: the figures cover only the ranks this source recorded (one "
                "node's ledger holds its own ranks); --prometheus URL reads the whole job")


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def step_text(summary: Mapping[str, Any]) -> str:
    """The ``STEP P50`` column: the step time p50, else (a record without percentiles)
    the mean step, marked ``mean``; ``-`` without either."""
    p50 = number(summary.get("step_seconds_p50"))
    if p50 is not None:
        return seconds_text(p50)
    mean = number(summary.get("step_seconds_mean"))
    return "-" if mean is None else f"{seconds_text(mean)} mean"


def top_verdict(summary: Mapping[str, Any]) -> str:
    """The verdict kind the run held longest (``-`` without any)."""
    verdicts = {kind: number(seconds) or 0.0
                for kind, seconds in dict(summary.get("verdicts") or {}).items()}
    if not verdicts or max(verdicts.values()) <= 0:
        return "-"
    return str(max(sorted(verdicts), key=lambda kind: verdicts[kind]))


def cost_text(summary: Mapping[str, Any]) -> str:
    cost = summary.get("cost")
    if not isinstance(cost, Mapping):
        return "-"
    value = number(cost.get("per_million_samples"))
    return "-" if value is None else f"{money(value)} {cost.get('currency', '')}".strip()


def goodput_text(summary: Mapping[str, Any]) -> str:
    """The run's productive share of its GPU-seconds: ``62%`` (``-`` when not booked)."""
    ratio = number(summary.get("goodput_ratio"))
    return "-" if ratio is None else f"{ratio:.0%}"


def largest_loss(summary: Mapping[str, Any]) -> tuple[str, float] | None:
    """The bucket other than ``productive`` with the most GPU-seconds and its share (0-1)
    of them; None when nothing was lost or nothing booked."""
    seconds = {bucket: number(value) or 0.0
               for bucket, value in dict(summary.get("gpu_seconds") or {}).items()}
    held = sum(seconds.values())
    losses = {bucket: value for bucket, value in seconds.items()
              if bucket != "productive" and value > 0}
    if held <= 0 or not losses:
        return None
    bucket = max(sorted(losses), key=lambda name: losses[name])
    return bucket, losses[bucket] / held


def largest_loss_text(summary: Mapping[str, Any]) -> str:
    """``largest_loss`` as ``data_wait 31%`` (``-`` when nothing was lost or nothing
    booked)."""
    found = largest_loss(summary)
    return "-" if found is None else f"{found[0]} {found[1]:.0%}"


def fail_slow_cell(summary: Mapping[str, Any]) -> str:
    """The ``FAIL-SLOW`` column: the largest change, ``rank 1 +35 % compute``, with
    ``+N more`` for the others; ``-`` without any."""
    largest = largest_fail_slow(summary)
    if largest is None:
        return "-"
    rank = str(largest.get("rank", ""))
    who = f"rank {rank}" if rank else "job"
    text = f"{who} {signed_percent(number(largest['ratio']) or 0.0)} {largest.get('part', '')}"
    others = len(fail_slow_changes(summary)) - 1
    return text + (f" +{others} more" if others else "")


def render_runs(views: Sequence[RunView]) -> str:
    if not views:
        return "no runs recorded\n"
    with_cost = any(isinstance(view.summary.get("cost"), Mapping) for view in views)
    with_fail_slow = any(fail_slow_changes(view.summary) for view in views)
    header = RUNS_HEADER + (("FAIL-SLOW",) if with_fail_slow else ()) + (
        ("COST/M SAMPLES",) if with_cost else ())
    rows = [header]
    for view in views:
        row = (
            view.run,
            view.job,
            utc_text(view.started),
            duration_text(view.duration_seconds, unknown="-"),
            coverage_text(view),
            quantity(samples_per_second(view.summary)),
            step_text(view.summary),
            top_verdict(view.summary),
            goodput_text(view.summary),
            largest_loss_text(view.summary),
            view.end_reason or "running",
        )
        extra = ((fail_slow_cell(view.summary),) if with_fail_slow else ()) + (
            (cost_text(view.summary),) if with_cost else ())
        rows.append(tuple(map(one_line, row + extra)))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    table = "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        + "\n"
        for row in rows
    )
    if any(view.partial for view in views):
        table += f"\n{PARTIAL_NOTE}\n"
    return table


def end_text(view: RunView) -> str:
    """``ended: crashed``, or ``running``."""
    return "running" if view.end_reason is None else f"ended: {view.end_reason}"


def _run_line(label: str, view: RunView) -> str:
    nodes = ", ".join(view.nodes) or "-"
    world = "-" if view.world_size is None else str(view.world_size)
    ranks = "-" if view.ranks is None else str(view.ranks)
    coverage = f"; ranks recorded {ranks} of {world}" if view.partial else ""
    facts = []
    verdict = view.summary.get("final_verdict")
    if isinstance(verdict, str):
        facts.append(f"final verdict {verdict}")
    checkpoints = number(view.summary.get("checkpoints"))
    if checkpoints is not None:
        last = view.summary.get("last_checkpoint")
        where = ""
        if isinstance(last, Mapping) and last.get("path"):
            where = f", the last at {last['path']} ({storage_words(last.get('storage'))})"
        # the ledger counts each rank's save (a sharded checkpoint once per rank)
        facts.append(count_text(int(checkpoints), "checkpoint save") + " by its ranks" + where)
    return (f"run {label}: {view.run} (job {view.job}, {view.config_hash}, started "
            f"{utc_text(view.started)}, {duration_text(view.duration_seconds, unknown='-')}, "
            f"{end_text(view)}; world size {world}{coverage}; nodes {nodes}"
            + "".join(f"; {fact}" for fact in facts) + ")")


def _movement_line(name: str, movement: Movement, text: Any) -> str:
    ratio = movement.change_ratio
    change = "" if ratio is None else f" ({signed_percent(ratio)})"
    return f"  {name:<22} {text(movement.a)} → {text(movement.b)}{change}"


def render_comparison(comparison: Comparison) -> str:
    lines = [comparison.summary, "", _run_line("A", comparison.a), _run_line("B", comparison.b),
             "", "changes:"]
    if comparison.changes:
        width = max(len(one_line(change.key)) for change in comparison.changes)
        for change in comparison.changes:
            before = "(unset)" if change.a is None else str(change.a)
            after = "(unset)" if change.b is None else str(change.b)
            lines.append(f"  {change.kind:<12} {one_line(change.key):<{width}}  "
                         f"{before} → {after}")
    else:
        lines.append("  unknown" if comparison.unavailable else "  none recorded")
    throughput = "samples/s" if comparison.throughput_basis == "job" else "samples/s per rank"
    if comparison.throughput_key != "samples_per_second":
        throughput += " (median)"
    lines += ["", "measured:", _movement_line(throughput, comparison.throughput, quantity)]
    if comparison.step_basis == "mean":
        lines.append(_movement_line("step time (mean)", comparison.step_seconds_p50,
                                    seconds_text))
    else:
        lines += [_movement_line("step time p50", comparison.step_seconds_p50, seconds_text),
                  _movement_line("step time p95", comparison.step_seconds_p95, seconds_text)]

    def share(value: float | None) -> str:
        return "-" if value is None else percent(value)

    for name, movement in comparison.phases.items():
        lines.append(f"  {phase_words(name):<22} {share(movement.a)} → {share(movement.b)}")
    if comparison.goodput.a is not None or comparison.goodput.b is not None:
        lines.append(f"  {'goodput':<22} {share(comparison.goodput.a)} → "
                     f"{share(comparison.goodput.b)}")
        for name, movement in loss_buckets(comparison).items():
            lines.append(f"  {'  ' + name:<22} {share(movement.a)} → {share(movement.b)} "
                         "of the GPU time")
    if comparison.cost_per_million_samples is not None:
        lines.append(_movement_line(
            f"cost/M samples ({comparison.currency})", comparison.cost_per_million_samples,
            lambda value: "-" if value is None else money(value)))
    slowed = {label: fail_slow_changes(view.summary)
              for label, view in (("A", comparison.a), ("B", comparison.b))}
    if any(slowed.values()):
        lines += ["", "fail-slow (a rank or the job became slower during the run):"]
        for label, changes in slowed.items():
            lines += [f"  run {label}: {fail_slow_text(change, held=True)}"
                      for change in changes] or [f"  run {label}: none recorded"]
    profiled = {label: profile_text(view.summary)
                for label, view in (("A", comparison.a), ("B", comparison.b))}
    if any(text is not None for text in profiled.values()):
        lines += ["", "profiles (the latest of each run, top operators by self time: "
                      "trainmon profile):"]
        lines += [f"  run {label}: {text or 'none recorded'}" for label, text in profiled.items()]
    if comparison.unavailable:
        lines += ["", "unavailable:", *(f"  {reason}" for reason in comparison.unavailable)]
    return "".join(one_line(line) + "\n" for line in lines)
