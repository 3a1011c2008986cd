"""The run ledger in ``doctor``'s report: each job's run against its baseline.

``doctor`` reads the node's ledger (``trainmon.runs.regression``) and hands
the report its records with the figures the ledger's commands make of them
(``PastRun``), defined here so that the report stays below those commands:

- ``History.live``: for each job diagnosed now, its latest run and the run it
  is measured against (``trainmon.runs.baseline``: which, and why), with the
  ``trainmon compare`` to run; the report's per-run figures (checkpoint saves
  and goodput of the run that goes on) come from the same record;
- ``History.ended``: doctor after the job: the last run of each job that
  ended lately, how it ended, its samples/s, verdict and goodput, and the
  ``trainmon runs`` / ``trainmon compare`` commands.

``history_lines`` and ``recent_lines`` write them in the report's language
(words from ``messages``); ``history_json`` is their part of the ``--json``
document. A run whose record holds fail-slow changes (``summary.fail_slow``: a rank or
the job became slower during the run) gets a line with its largest, for the run and for
the run it is measured against (``fail_slow_text``). The profiles of a run
(``summary.profiles``: ``trainmon profile``) are in its ``--json`` entry; the latest one
with operators (``LatestProfile``, its top operators in the words of
``trainmon.runs.profiles``) is the next step of a compute verdict, or, without one, the
``trainmon profile`` to run (``profile_step``).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from trainmon.ledger import RunRecord
from trainmon.ledger.summary import fail_slow_entries, profile_entries
from trainmon.report.messages import (
    PROFILE_STEP,
    Pair,
    ago_text,
    end_word,
    fail_slow_values,
    heading,
    history_text,
    kind_name,
    pick,
    render,
)
from trainmon.terminal import duration_text

#: A figure the ledger does not know.
_UNKNOWN = "?"
#: A run's largest fail-slow change (the words of ``messages.fail_slow_values``), and how
#: many more it had.
FAIL_SLOW_LINE: Pair = (
    "fail-slow in run {run}: {who} became {ratio:.0%} slower at {start_text} for {held}: "
    "its {part_words} grew; {cause_words}",
    "运行 {run} 中出现 fail-slow：{who}从 {start_text} 起慢了 {ratio:.0%}，持续 {held}："
    "{part_words}变长了；{cause_words}")
FAIL_SLOW_MORE: Pair = (" (and {more} more: trainmon compare)",
                        "（另有 {more} 处：见 trainmon compare）")


@dataclass(frozen=True)
class LatestProfile:
    """A run's newest profile with operators (``summary.profiles``), and its top operators
    as ``trainmon.runs.profiles.top_operators`` words them."""

    #: The ledger's entry (``id``, ``rank``, ``time``, ``steps``, ``trace``...).
    entry: Mapping[str, object]
    #: ``device``: by GPU self time; ``cpu``: by CPU self time (a CPU-only job).
    by: str
    #: ``aten::mm 41 %, aten::addmm 12 %, …``
    operators: str


@dataclass(frozen=True)
class PastRun:
    """One run as the node's ledger recorded it (this node's ranks), and the figures
    ``trainmon runs`` shows of it."""

    record: RunRecord
    samples_per_second: float | None
    #: The verdict the run held longest (as ``trainmon runs`` shows it); None: none.
    verdict: str | None = None
    goodput_ratio: float | None = None
    #: Its largest bucket other than ``productive`` and that bucket's share (0-1).
    largest_loss: str | None = None
    largest_loss_share: float | None = None
    #: Checkpoint saves its ranks completed (the ledger's ``checkpoints``); None: none
    #: reported.
    checkpoint_saves: int | None = None
    duration_seconds: float | None = None
    #: Its newest profile with operators; None: none (``trainmon profile``).
    profile: LatestProfile | None = None

    @property
    def nodes(self) -> int | None:
        """The nodes it spanned, with as many ranks on each as on this one."""
        record = self.record
        if record.world_size is None or record.ranks <= 0:
            return None
        return math.ceil(record.world_size / record.ranks)

    def to_json(self) -> dict[str, object]:
        record = self.record
        return {"job": record.job, "run": record.run, "started": record.started,
                "ended": record.ended, "end_reason": record.end_reason,
                "world_size": record.world_size, "ranks": record.ranks,
                "samples_per_second": self.samples_per_second, "verdict": self.verdict,
                "goodput_ratio": self.goodput_ratio, "checkpoint_saves": self.checkpoint_saves,
                "fail_slow": self.fail_slow, "profiles": self.profiles}

    @property
    def fail_slow(self) -> list[dict[str, object]]:
        """Its fail-slow changes as the ledger recorded them (``summary.fail_slow``)."""
        return fail_slow_entries(self.record.summary.get("fail_slow"))

    @property
    def profiles(self) -> list[dict[str, object]]:
        """Its profiles as the ledger recorded them (``summary.profiles``), oldest first."""
        return profile_entries(self.record.summary.get("profiles"))


@dataclass(frozen=True)
class RunHistory:
    """A job's latest run and what it is measured against."""

    run: PastRun
    #: The previous comparable run (None: there is none).
    baseline: PastRun | None
    #: The baseline finished; False: no comparable run did, the newest that ended otherwise.
    baseline_finished: bool
    #: samples/s per rank against the baseline's, less 1 (negative: slower).
    change_ratio: float | None
    #: Slower than the baseline by more than the regression share.
    slower: bool
    #: The fastest comparable run of the look-back when the run is much slower than it too.
    fastest: PastRun | None = None
    fastest_change_ratio: float | None = None

    @property
    def job(self) -> str:
        return self.run.record.job


@dataclass(frozen=True)
class History:
    """What ``doctor`` shows of the node's ledger."""

    #: The ledger file read (the commands shown name it).
    ledger: str
    #: Unix time the ledger was read (ages are counted from it).
    now: float
    #: The regression share (``contract.THROUGHPUT_REGRESSION_RATIO``) and the fastest
    #: run's look-back (seconds), for the words.
    threshold: float
    lookback_seconds: float
    #: How far back ``ended`` looks (seconds).
    recent_seconds: float
    live: tuple[RunHistory, ...] = ()
    ended: tuple[RunHistory, ...] = ()

    def current(self, job: str) -> PastRun | None:
        """The run of ``job`` that goes on, as the ledger records it; None when its latest
        record has ended (the live run is not recorded yet) or there is none."""
        found = self.latest(job)
        return found if found is not None and found.record.end_reason is None else None

    def latest(self, job: str) -> PastRun | None:
        """The latest run of ``job`` (diagnosed now) the ledger records, ended or not."""
        return next((entry.run for entry in self.live if entry.job == job), None)


def rate_text(value: float | None) -> str:
    """``1 210``, ``99.5``, ``0.123``; ``?`` when unknown (``trainmon runs``' format)."""
    if value is None:
        return _UNKNOWN
    if abs(value) >= 100:
        return f"{value:,.0f}".replace(",", " ")
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def signed_percent(ratio: float | None) -> str:
    """``-0.183`` → ``−18 %``; ``?`` when unknown."""
    if ratio is None:
        return _UNKNOWN
    value = round(ratio * 100)
    return "±0 %" if value == 0 else f"{'+' if value > 0 else '−'}{abs(value)} %"


def percent_text(ratio: float | None) -> str:
    return _UNKNOWN if ratio is None else f"{ratio * 100:.0f} %"


def compare_command(history: History, entry: RunHistory, against: PastRun) -> str:
    return (f"trainmon compare {shlex.quote(against.record.run)} "
            f"{shlex.quote(entry.run.record.run)} "
            f"--ledger {shlex.quote(history.ledger)}")


def runs_command(history: History, entry: RunHistory) -> str:
    return (f"trainmon runs --job {shlex.quote(entry.job)} "
            f"--ledger {shlex.quote(history.ledger)}")


def _ended_words(history: History, run: PastRun, lang: str) -> dict[str, str]:
    record = run.record
    at = record.ended if record.ended is not None else record.updated
    return {"end": end_word(record.end_reason, lang), "ago": ago_text(history.now - at, lang)}


def _nodes(run: PastRun) -> dict[str, object]:
    nodes = run.nodes
    world_size = run.record.world_size
    return {"world_size": _UNKNOWN if world_size is None else world_size,
            "nodes": _UNKNOWN if nodes is None else nodes,
            "nodes_plural": "" if nodes == 1 else "s"}


def comparison_text(history: History, entry: RunHistory, lang: str) -> str:
    """``−22 % compared with run vit-1 (finished 2 h ago, same world size 8 on 1 node):
    slower by more than 20 %``, or that there is no comparable run."""
    baseline = entry.baseline
    if baseline is None:
        return history_text("no_baseline", lang, **_nodes(entry.run))
    text = history_text("compared", lang, change=signed_percent(entry.change_ratio),
                        baseline=baseline.record.run, **_ended_words(history, baseline, lang),
                        **_nodes(baseline))
    if not entry.baseline_finished:
        text += history_text("fallback", lang)
    if entry.slower:
        text += ": " if lang != "zh" else "："
        text += history_text("slower", lang, threshold=percent_text(history.threshold))
    return text


def fastest_text(history: History, entry: RunHistory, lang: str) -> str | None:
    """The fastest comparable run of the look-back when the run is much slower than it."""
    if entry.fastest is None:
        return None
    return history_text(
        "fastest", lang, change=signed_percent(entry.fastest_change_ratio),
        days=history.lookback_seconds / 86400, fastest=entry.fastest.record.run,
        **_ended_words(history, entry.fastest, lang))


def fail_slow_text(run: PastRun, lang: str) -> str | None:
    """``fail-slow in run vit-2: rank 1 became 35% slower at 10:42:05 UTC for 5m00s: its
    compute per step grew; its cgroup's CPU quota throttles it``; None without any."""
    changes = run.fail_slow
    if not changes:
        return None
    largest = max(changes, key=lambda change: _number(change.get("ratio")) or 0.0)
    text = render(pick(FAIL_SLOW_LINE, lang), {
        **fail_slow_values(largest, lang), "run": run.record.run,
        "held": duration_text(_number(largest.get("seconds")), unknown=_UNKNOWN)})
    if len(changes) > 1:
        text += render(pick(FAIL_SLOW_MORE, lang), {"more": len(changes) - 1})
    return text


def profile_step(history: History | None, job: str, lang: str) -> str:
    """The step a compute verdict adds: the top operators of the latest profile of the
    job's latest run in the ledger, ``Top operators by GPU time: aten::mm 41 %, … (profile
    of rank 0, 5 steps, 12 min ago; trace: /var/lib/trainmon/profiles/...)``; without one
    (or without a ledger), the ``trainmon profile`` to run."""
    run = None if history is None else history.latest(job)
    profile = None if run is None else run.profile
    if history is None or profile is None:
        return render(pick(PROFILE_STEP["none"], lang), {"job": shlex.quote(job)})
    entry = profile.entry
    trace = entry.get("trace")
    when = _number(entry.get("time"))
    steps = _number(entry.get("steps")) or 0.0
    return render(pick(PROFILE_STEP[profile.by], lang), {
        "operators": profile.operators, "rank": entry.get("rank"), "steps": steps,
        "steps_plural": "" if f"{steps:.0f}" == "1" else "s",
        "ago": _UNKNOWN if when is None else ago_text(history.now - when, lang),
        "trace_text": render(pick(PROFILE_STEP["trace"], lang), {"trace": trace})
        if isinstance(trace, str) and trace else ""})


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _fail_slow_lines(entry: RunHistory, lang: str, indent: str) -> list[str]:
    """The fail-slow lines of the run and of the run it is measured against."""
    runs = [entry.run] + ([entry.baseline] if entry.baseline is not None else [])
    return [indent + text for run in runs if (text := fail_slow_text(run, lang)) is not None]


def _commands(history: History, entry: RunHistory, *, with_runs: bool) -> list[str]:
    commands = [runs_command(history, entry)] if with_runs else []
    for against in (entry.baseline, entry.fastest):
        if against is not None:
            commands.append(compare_command(history, entry, against))
    return commands


def history_lines(history: History | None, lang: str) -> list[str]:
    """The "Run history" section: a line per diagnosed job with a run in the ledger."""
    if history is None or not history.live:
        return []
    separator = "；" if lang == "zh" else "; "
    lines = ["", heading("history", lang)]
    for entry in history.live:
        head = history_text("run", lang, job=entry.job, run=entry.run.record.run,
                            rate=rate_text(entry.run.samples_per_second))
        line = f"   {head}{'，' if lang == 'zh' else ', '}{comparison_text(history, entry, lang)}"
        if entry.baseline is not None:
            line += separator + compare_command(history, entry, entry.baseline)
        lines.append(line)
        lines += _fail_slow_lines(entry, lang, "      ")
        if (fastest := fastest_text(history, entry, lang)) is not None:
            assert entry.fastest is not None
            lines.append(f"      {fastest}{separator}"
                         f"{compare_command(history, entry, entry.fastest)}")
    return lines


def recent_lines(history: History | None, lang: str) -> list[str]:
    """Doctor after the job: the last run of each job that ended lately."""
    if history is None or not history.ended:
        return []
    lines = ["", heading("recent", lang, hours=history.recent_seconds / 3600)]
    for entry in history.ended:
        run = entry.run
        key = "run_running" if run.record.end_reason is None else "run_ended"
        lines.append("   " + history_text(
            key, lang, job=entry.job, run=run.record.run,
            rate=rate_text(run.samples_per_second),
            duration=duration_text(run.duration_seconds, unknown=_UNKNOWN),
            verdict=history_text("no_verdict", lang) if run.verdict is None
            else history_text("verdict", lang, kind=kind_name(run.verdict, lang)),
            goodput=percent_text(run.goodput_ratio), **_ended_words(history, run, lang)))
        lines.append("      " + comparison_text(history, entry, lang))
        lines += _fail_slow_lines(entry, lang, "      ")
        if (fastest := fastest_text(history, entry, lang)) is not None:
            lines.append("      " + fastest)
        lines.append("      " + history_text(
            "commands", lang,
            commands=("；" if lang == "zh" else "; ").join(
                _commands(history, entry, with_runs=True))))
    return lines


def history_json(history: History | None, entries: tuple[RunHistory, ...], lang: str
                 ) -> list[dict[str, object]]:
    """``previous_runs`` / ``recent_runs`` of the ``--json`` document."""
    if history is None:
        return []
    return [{
        **entry.run.to_json(),
        "baseline": None if entry.baseline is None else {
            **entry.baseline.to_json(), "finished": entry.baseline_finished},
        "change_ratio": None if entry.change_ratio is None else round(entry.change_ratio, 4),
        "slower": entry.slower,
        "fastest": None if entry.fastest is None else entry.fastest.to_json(),
        "fastest_change_ratio": None if entry.fastest_change_ratio is None
        else round(entry.fastest_change_ratio, 4),
        "previous_run": None if entry.baseline is None else entry.baseline.record.run,
        "previous_started": None if entry.baseline is None else entry.baseline.record.started,
        "commands": _commands(history, entry, with_runs=True),
        "text": comparison_text(history, entry, lang),
    } for entry in entries]
