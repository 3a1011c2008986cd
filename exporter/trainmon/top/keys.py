"""What each key does to ``trainmon top``'s ``ScreenState``: a pure function.

Keys arrive as names (``up``, ``down``, ``enter``, ``esc``, ``backspace``,
``resize``) or as the character typed; ``screen`` makes curses' codes into
these. ``apply_key`` returns the new state, or None to quit.
"""

from __future__ import annotations

from dataclasses import replace

from trainmon.top.model import TopView
from trainmon.top.render import SORT_KEYS, ScreenState, selected_job, visible_jobs

#: The longest filter typed (characters).
FILTER_MAX_CHARS = 64


def apply_key(state: ScreenState, key: str, view: TopView) -> ScreenState | None:
    """``state`` after ``key``; None when ``key`` quits."""
    if state.typing is not None:
        return _typing(state, key)
    if key in ("q", "Q"):
        return None
    if key == "l":
        return replace(state, lang="zh" if state.lang == "en" else "en")
    if state.detail:
        if key in ("enter", "esc", "backspace", "left"):
            return replace(state, detail=False, scroll=0)
        if key in ("up", "k"):
            return replace(state, scroll=max(0, state.scroll - 1))
        if key in ("down", "j"):
            return replace(state, scroll=state.scroll + 1)
        if key == "p":  # the screen asks for the job's profile (trainmon.top.profiles)
            return replace(state, ask_profile=True)
        return state
    if key == "s":
        return replace(state, sort=SORT_KEYS[(SORT_KEYS.index(state.sort) + 1) % len(SORT_KEYS)])
    if key == "r":
        return replace(state, reverse=not state.reverse)
    if key == "m":
        return replace(state, marked_only=not state.marked_only)
    if key == "/":
        return replace(state, typing=state.filter)
    if key in ("up", "down", "k", "j"):
        return _move(state, view, -1 if key in ("up", "k") else 1)
    if key == "enter":
        job = selected_job(view, state)
        return state if job is None else replace(state, detail=True, scroll=0,
                                                 selected=job.job)
    return state


def _typing(state: ScreenState, key: str) -> ScreenState:
    typed = state.typing or ""
    if key == "enter":
        return replace(state, filter=typed, typing=None, selected="")
    if key == "esc":
        return replace(state, filter="", typing=None)
    if key == "backspace":
        return replace(state, typing=typed[:-1])
    if len(key) == 1 and key.isprintable() and len(typed) < FILTER_MAX_CHARS:
        return replace(state, typing=typed + key)
    return state


def _move(state: ScreenState, view: TopView, step: int) -> ScreenState:
    jobs = [job.job for job in visible_jobs(view, state)]
    if not jobs:
        return state
    current = selected_job(view, state)
    index = jobs.index(current.job) if current is not None else 0
    return replace(state, selected=jobs[max(0, min(len(jobs) - 1, index + step))])
