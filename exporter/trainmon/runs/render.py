"""The text of ``trainmon runs`` (a table, newest first) and ``trainmon compare``
(the sentence first, then the changes and the measured numbers side by side)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainmon.runs.compare import (
    Comparison,
    Movement,
    money,
    percent,
    phase_words,
    quantity,
    signed_percent,
)
from trainmon.runs.timespec import utc_text
from trainmon.runs.view import RunView, number

RUNS_HEADER = ("RUN", "JOB", "STARTED", "DURATION", "SAMPLES/S", "STEP P50", "VERDICT", "END")


def duration_text(seconds: float | None) -> str:
    """``95`` → ``1m35s``, ``7260`` → ``2h01m``; None → ``-``."""
    if seconds is None:
        return "-"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


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


def render_runs(views: Sequence[RunView]) -> str:
    if not views:
        return "no runs recorded\n"
    with_cost = any(isinstance(view.summary.get("cost"), Mapping) for view in views)
    header = RUNS_HEADER + (("COST/M SAMPLES",) if with_cost else ())
    rows = [header]
    for view in views:
        row = (
            view.run,
            view.job,
            utc_text(view.started),
            duration_text(view.duration_seconds),
            quantity(number(view.summary.get("samples_per_second_median"))),
            seconds_text(number(view.summary.get("step_seconds_p50"))),
            top_verdict(view.summary),
            view.end_reason or "running",
        )
        rows.append(row + ((cost_text(view.summary),) if with_cost else ()))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        + "\n"
        for row in rows
    )


def _run_line(label: str, view: RunView) -> str:
    nodes = ", ".join(view.nodes) or "-"
    world = "-" if view.world_size is None else str(view.world_size)
    return (f"run {label}: {view.run} (job {view.job}, {view.config_hash}, started "
            f"{utc_text(view.started)}, {duration_text(view.duration_seconds)}, "
            f"{view.end_reason or 'running'}; world size {world}; nodes {nodes})")


def _movement_line(name: str, movement: Movement, text: Any) -> str:
    ratio = movement.change_ratio
    change = "" if ratio is None else f" ({signed_percent(ratio)})"
    return f"  {name:<22} {text(movement.a)} → {text(movement.b)}{change}"


def render_comparison(comparison: Comparison) -> str:
    lines = [comparison.summary, "", _run_line("A", comparison.a), _run_line("B", comparison.b),
             "", "changes:"]
    if comparison.changes:
        width = max(len(change.key) for change in comparison.changes)
        for change in comparison.changes:
            before = "(unset)" if change.a is None else str(change.a)
            after = "(unset)" if change.b is None else str(change.b)
            lines.append(f"  {change.kind:<12} {change.key:<{width}}  {before} → {after}")
    else:
        lines.append("  unknown" if comparison.unavailable else "  none recorded")
    lines += ["", "measured:",
              _movement_line("samples/s (median)", comparison.throughput, quantity),
              _movement_line("step time p50", comparison.step_seconds_p50, seconds_text),
              _movement_line("step time p95", comparison.step_seconds_p95, seconds_text)]

    def share(value: float | None) -> str:
        return "-" if value is None else percent(value)

    for name, movement in comparison.phases.items():
        lines.append(f"  {phase_words(name):<22} {share(movement.a)} → {share(movement.b)}")
    if comparison.cost_per_million_samples is not None:
        lines.append(_movement_line(
            f"cost/M samples ({comparison.currency})", comparison.cost_per_million_samples,
            lambda value: "-" if value is None else money(value)))
    if comparison.unavailable:
        lines += ["", "unavailable:", *(f"  {reason}" for reason in comparison.unavailable)]
    return "\n".join(lines) + "\n"
