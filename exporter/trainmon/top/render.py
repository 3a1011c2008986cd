"""``trainmon top``'s screen as lines: a ``TopView`` and the keys' state, no terminal.

``render(view, state, width, height)`` returns at most ``height`` lines, each a
tuple of ``(text, style)`` segments no wider than ``width`` terminal cells (a
Chinese character takes two: ``cells``); the curses loop (``screen``) only
paints them, with colours or, under ``NO_COLOR``, without. Two views:

- the table: a title line (source, time of the data, window), a line that says
  why the source cannot be read when it cannot (the data shown stays, with its
  age), the column headings, then per job a line with its verdict and goodput
  and a line per rank (``COLUMNS``), the GPUs held by processes without
  telemetry, and a line of keys. Columns are dropped, lowest ``priority`` first,
  until the rest leaves ``FOUND_MIN_CELLS`` to the rank's marks; a line too long is
  cut with ``…``; with more lines than rows the selected job's are shown;
- the detail of the selected job: ``doctor``'s lines for its verdict (findings,
  where each hung rank is, next steps: ``trainmon.report.render.verdict_lines``)
  and goodput, and every figure of each rank, wrapped to the width.

The words are ``doctor``'s where it has them (``trainmon.report.messages``) and
``trainmon.top.words`` for the screen's own, in ``en`` or ``zh``. Every text from a
daemon goes through ``trainmon.terminal.one_line``.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trainmon.diagnosis.rules import ACTIONABLE_KINDS
from trainmon.report.messages import Pair, finding_text, heading, kind_name, pick
from trainmon.report.messages import render as render_words
from trainmon.report.render import goodput_line, verdict_lines
from trainmon.terminal import duration_text, one_line
from trainmon.top.model import JobRow, Mark, RankRow, TopView
from trainmon.top.profiles import Notice
from trainmon.top.words import CLEARED, FOUND_HEADING, MARK_WORDS, WHERE, WORDS

#: A run of text in one style; a line is a tuple of them.
Segment = tuple[str, str]
Line = tuple[Segment, ...]
#: Styles the screen paints (``screen.STYLE_ATTRIBUTES``).
STYLES = ("", "title", "heading", "job", "selected", "ok", "warn", "bad", "dim")
#: Cells the marks column keeps however narrow the terminal.
FOUND_MIN_CELLS = 16
#: Sort keys, in the order ``s`` goes through them.
SORT_KEYS = ("rank", "step", "samples", "wait", "comm", "util", "mark")
ELLIPSIS = "…"

MARK_STYLES = {"hung": "bad", "gone": "bad", "stalled": "bad", "straggler": "bad",
               "waiting": "warn", "fail_slow": "warn", "slowest": "dim"}


@dataclass(frozen=True)
class Column:
    key: str
    heading: Pair
    #: Cells, heading and values right-aligned in them.
    cells: int
    #: Dropped first when the terminal is narrow: the lowest.
    priority: int
    value: Callable[[RankRow], str]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}s" if value < 10 else f"{value:.1f}s"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _groups(row: RankRow) -> str:
    return " ".join(f"{group} {ratio:.0%}" for group, ratio in row.comm_groups) or "-"


COLUMNS = (
    Column("rank", ("RANK", "RANK"), 5, 100, lambda row: row.rank),
    Column("gpu", ("GPU", "GPU"), 4, 40, lambda row: row.gpu or "-"),
    Column("step", ("STEP", "步长"), 7, 90, lambda row: _seconds(row.step_seconds)),
    Column("samples", ("SMP/S", "样本/秒"), 7, 50, lambda row: _rate(row.samples_per_second)),
    Column("wait", ("WAIT", "等数据"), 6, 80, lambda row: _percent(row.data_wait_ratio)),
    Column("comm", ("COMM", "通信"), 5, 60, lambda row: _percent(row.comm_ratio)),
    Column("util", ("UTIL", "利用率"), 6, 70, lambda row: _percent(row.gpu_utilization)),
    Column("sm", ("SM", "SM"), 4, 30, lambda row: _percent(row.sm_active)),
    Column("mem", ("MEM", "显存"), 4, 20, lambda row: _percent(row.memory_used_ratio)),
    Column("groups", ("COMM/GROUP", "通信/维度"), 14, 10, _groups),
)
#: The value each sort key orders ranks by (ascending); ``None`` sorts last.
SORT_VALUES: Mapping[str, Callable[[RankRow], float | None]] = {
    "step": lambda row: None if row.step_seconds is None else -row.step_seconds,
    "samples": lambda row: row.samples_per_second,
    "wait": lambda row: None if row.data_wait_ratio is None else -row.data_wait_ratio,
    "comm": lambda row: None if row.comm_ratio is None else -row.comm_ratio,
    "util": lambda row: row.gpu_utilization,
    "mark": lambda row: float(row.urgency),
}


@dataclass(frozen=True)
class ScreenState:
    """What the keys chose."""

    lang: str = "en"
    sort: str = "rank"
    reverse: bool = False
    #: Jobs whose name holds this (case-insensitive); "" for all.
    filter: str = ""
    marked_only: bool = False
    #: The selected job, by name ("" for the first shown).
    selected: str = ""
    detail: bool = False
    #: First line of the detail shown.
    scroll: int = 0
    #: While the filter is typed: its text so far; None otherwise.
    typing: str | None = None
    #: ``p`` was pressed on the job shown: the screen asks for its profile.
    ask_profile: bool = False
    #: The latest profile's line (``trainmon.top.profiles``), shown above the keys.
    notice: Notice | None = None


def cells(text: str) -> int:
    """Terminal cells ``text`` takes: two for wide (CJK) characters, none for combining."""
    return sum(0 if unicodedata.combining(char) else
               2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, ending with ``…`` when cut."""
    if cells(text) <= width:
        return text
    if width <= 0:
        return ""
    out, used = [], 0
    for char in text:
        size = cells(char)
        if used + size > width - 1:
            break
        out.append(char)
        used += size
    return "".join(out) + ELLIPSIS


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` cells, its leading spaces kept, broken at
    spaces; a word longer than a line (Chinese text has no spaces) fills each line
    to the end; every line after the first starts with ``indent``."""
    width = max(width, cells(indent) + 2)
    body = text.lstrip(" ")
    line = text[:len(text) - len(body)]
    lines: list[str] = []
    fresh = True  # nothing but indentation on the line yet
    for word in body.split(" "):
        candidate = line + word if fresh else f"{line} {word}"
        if cells(candidate) <= width:
            line, fresh = candidate, False
            continue
        if cells(indent + word) <= width:  # it fits on a line of its own
            lines.append(line)
            line, fresh = indent + word, False
            continue
        if not fresh:
            line += " "
        for char in word:
            if cells(line + char) > width:
                lines.append(line)
                line = indent
            line += char
        fresh = False
    lines.append(line)
    return lines


def visible_jobs(view: TopView, state: ScreenState) -> list[JobRow]:
    """The jobs shown, filtered and in order, each with its ranks filtered and sorted."""
    wanted = state.filter.casefold()
    jobs = []
    for job in view.jobs:
        if wanted and wanted not in job.job.casefold():
            continue
        ranks = [row for row in job.ranks if row.marks or not state.marked_only]
        if state.marked_only and not ranks:
            continue
        jobs.append(JobRow(job.verdict, job.goodput, tuple(_sorted(ranks, state))))
    if state.sort == "mark":
        jobs.sort(key=lambda job: min((row.urgency for row in job.ranks), default=99),
                  reverse=state.reverse)
    return jobs


def _sorted(ranks: Sequence[RankRow], state: ScreenState) -> list[RankRow]:
    by = SORT_VALUES.get(state.sort)
    if by is None:
        ordered = list(ranks)  # the engine's order: by rank number
    else:
        key = by
        known = sorted((row for row in ranks if key(row) is not None),
                       key=lambda row: key(row) or 0.0)
        ordered = known + [row for row in ranks if key(row) is None]
    return ordered[::-1] if state.reverse else ordered


def selected_job(view: TopView, state: ScreenState) -> JobRow | None:
    """The selected job among those shown; the first when the name is not shown."""
    jobs = visible_jobs(view, state)
    return next((job for job in jobs if job.job == state.selected), jobs[0] if jobs else None)


def render(view: TopView, state: ScreenState, width: int, height: int,
           now: float | None = None) -> list[Line]:
    """The screen: at most ``height`` lines of at most ``width`` cells."""
    lang = state.lang
    if width < 10 or height < 3:
        small: Line = ((cut(pick(WORDS["too_small"], lang), max(width, 0)), "bad"),)
        return [small][:max(height, 0)]
    now = time.time() if now is None else now
    top = [_title(view, lang, width)]
    if view.problem:
        top.append(_problem(view, lang, now))
    # the last line says the keys; the one above it, the latest profile's notice
    notice: list[Line] = []
    if state.notice is not None and height - 1 > len(top):
        notice = [((state.notice.text(lang), state.notice.style),)]
    rows = height - 1 - len(notice)
    job = selected_job(view, state)
    if state.detail and job is not None:
        body = _detail(job, view, lang, width)
        keys = pick(WORDS["detail_keys"], lang)
        start = max(0, min(state.scroll, len(body) - (rows - len(top))))
        body = body[start:start + rows - len(top)]
    else:
        body = _table(view, state, job, width, rows - len(top))
        keys = _keys(state)
    if state.typing is not None:
        bottom: Line = (((pick(WORDS["filter_prompt"], lang) + state.typing), "selected"),)
    else:
        bottom = ((keys, "dim"),)
    shown = [_fit(line, width) for line in [*top, *body][:rows]]
    return [*shown, *[()] * (rows - len(shown)), *[_fit(line, width) for line in notice],
            _fit(bottom, width)]


def _title(view: TopView, lang: str, width: int) -> Line:
    parts = [pick(WORDS["title"], lang), view.source]
    if view.wall is not None:
        parts.append(time.strftime("%H:%M:%S", time.localtime(view.wall)))
    if view.report is not None:
        parts.append(pick(WORDS["window"], lang).format(
            seconds=view.report.source.get("seconds", 0.0)))
    return ((" · ".join(parts), "title"),)


def _problem(view: TopView, lang: str, now: float) -> Line:
    if view.wall is None:
        text = pick(WORDS["no_data"], lang).format(problem=view.problem)
    else:
        text = pick(WORDS["unreadable"], lang).format(
            problem=view.problem, age=duration_text(now - view.wall, unknown="?"))
    return ((text, "bad"),)


def _keys(state: ScreenState) -> str:
    lang = state.lang
    sort = next((pick(column.heading, lang) for column in COLUMNS if column.key == state.sort),
                pick(FOUND_HEADING, lang)).lower()
    return pick(WORDS["keys"], lang).format(
        sort=sort, arrow="↑" if state.reverse else "",
        filter=f":{state.filter}" if state.filter else "",
        marked=pick(WORDS["marked_all" if state.marked_only else "marked_only"], lang))


def columns_for(width: int, rows: Sequence[RankRow] = ()) -> list[Column]:
    """The columns that leave ``FOUND_MIN_CELLS`` for the marks in ``width`` cells; the
    per-group column only when a rank reports groups."""
    chosen = [column for column in COLUMNS
              if column.key != "groups" or any(row.comm_groups for row in rows)]
    while chosen and sum(column.cells + 1 for column in chosen) + FOUND_MIN_CELLS > width:
        lowest = min((column for column in chosen if column.key != "rank"),
                     key=lambda column: column.priority, default=None)
        if lowest is None:
            break
        chosen.remove(lowest)
    return chosen


def _table(view: TopView, state: ScreenState, selected: JobRow | None, width: int,
           rows: int) -> list[Line]:
    lang = state.lang
    if view.report is None:
        return [] if view.problem else [((pick(WORDS["waiting"], lang), "dim"),)]
    jobs = visible_jobs(view, state)
    columns = columns_for(width, [row for job in jobs for row in job.ranks])
    headings = "".join(_right(pick(column.heading, lang), column.cells) + " "
                       for column in columns) + pick(FOUND_HEADING, lang)
    lines: list[Line] = []
    selected_at = 0
    for job in jobs:
        if selected is not None and job.job == selected.job:
            selected_at = len(lines)
        lines.append(_job_line(job, lang, selected is not None and job.job == selected.job))
        lines += [_rank_line(row, columns, lang) for row in job.ranks]
    if not jobs:
        lines.append(((pick(WORDS["no_match"], lang) if view.jobs
                       else heading("no_jobs", lang), "dim"),))
    for held in view.held:
        what = pick(WORDS["held_idle" if held.code == "idle_held" else "held_busy"], lang)
        lines.append(((pick(WORDS["held"], lang).format(
            gpu=held.gpu, holder=held.holder, pids=held.pids or "-", what=what),
            "warn" if held.code == "idle_held" else "dim"),))
    room = rows - 1
    shown = next((job for job in jobs if selected is not None and job.job == selected.job),
                 None)
    if shown is not None and selected_at + 1 + len(shown.ranks) > room:
        lines = lines[selected_at:]  # from the selected job's line down
    lines = lines[:room]
    return [((headings, "heading"),), *lines]


def _job_line(job: JobRow, lang: str, selected: bool) -> Line:
    verdict = job.verdict
    style = ("bad" if verdict.kind in ACTIONABLE_KINDS else
             "ok" if verdict.kind == "compute" else "dim")
    deciding = verdict.findings[0]
    goodput = ("" if job.goodput is None
               else "  " + pick(WORDS["goodput"], lang).format(ratio=job.goodput))
    marker = "▸ " if selected else "  "
    return ((marker + verdict.job, "selected" if selected else "job"),
            ("  " + kind_name(verdict.kind, lang).upper(), style),
            (goodput, ""),
            ("  " + finding_text(deciding.code, deciding.values, lang), "dim"))


def _rank_line(row: RankRow, columns: Sequence[Column], lang: str) -> Line:
    figures = "".join(_right(column.value(row), column.cells) + " " for column in columns)
    segments: list[Segment] = [(figures, "")]
    for index, mark in enumerate(row.marks):
        segments.append(((", " if index else "") + mark_text(mark, lang),
                         "dim" if mark.ago is not None else MARK_STYLES[mark.code]))
    return tuple(segments)


def mark_text(mark: Mark, lang: str) -> str:
    """``HUNG loader 11s``; ``was HUNG loader 11s 5s ago`` once it cleared."""
    where = WHERE.get(mark.where)
    text = render_words(pick(MARK_WORDS[mark.code], lang), {
        "where": mark.where if where is None else pick(where, lang), "name": mark.name,
        "seconds": "" if mark.seconds is None else duration_text(mark.seconds, unknown=""),
        "ratio": mark.ratio if mark.ratio is not None else 0.0})
    text = " ".join(text.split())
    if mark.ago is None:
        return text
    return pick(CLEARED, lang).format(mark=text, ago=duration_text(mark.ago, unknown="?"))


def _detail(job: JobRow, view: TopView, lang: str, width: int) -> list[Line]:
    verdict = job.verdict
    report = view.report
    goodput = next((entry for entry in report.goodput if entry.job == job.job), None) \
        if report is not None else None
    head, *rest = verdict_lines(verdict, lang)
    line = goodput_line(goodput, lang)
    lines: list[Line] = []
    for index, text in enumerate([head, *([line] if line else []), *rest]):
        indent = " " * (len(text) - len(text.lstrip()) + 3)
        style = "job" if index == 0 else "heading" if "+" in text[:8] else ""
        lines += [((piece, style),) for piece in wrap(text.rstrip(), width, indent)]
    lines.append((("", ""),))
    lines.append(((pick(WORDS["ranks"], lang), "heading"),))
    for row in job.ranks:
        figures = ", ".join(f"{pick(column.heading, lang)} {column.value(row)}"
                            for column in COLUMNS if column.key not in ("rank", "groups"))
        if row.comm_groups:
            figures += f" ({pick(WORDS['comm_groups'], lang)}: {_groups(row)})"
        marks = "; ".join(mark_text(mark, lang) for mark in row.marks)
        text = f"   rank {row.rank}: {figures}" + (f" — {marks}" if marks else "")
        style = min((MARK_STYLES[mark.code] for mark in row.marks if mark.ago is None),
                    key=lambda name: ("bad", "warn", "dim").index(name), default="")
        lines += [((piece, style),) for piece in wrap(text, width, "      ")]
    return lines


def _right(text: str, width: int) -> str:
    text = cut(text, width)
    return " " * (width - cells(text)) + text


def _fit(line: Line, width: int) -> Line:
    """``line`` cut to ``width`` cells, each segment's text made one safe line."""
    fitted: list[Segment] = []
    used = 0
    for text, style in line:
        text = one_line(text)
        room = width - used
        if room <= 0:
            break
        if cells(text) > room:
            text = cut(text, room)
        fitted.append((text, style))
        used += cells(text)
    return tuple(fitted)


def line_text(line: Line) -> str:
    """A line's text without its styles."""
    return "".join(text for text, _ in line)
