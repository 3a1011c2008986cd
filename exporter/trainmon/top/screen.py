"""``trainmon top``'s terminal: a reading thread and the curses loop that paints.

``Poller`` reads the source once a second in a thread of its own, so a slow or
vanished daemon never holds the keys: each read (``SnapshotSource.read``) goes
to the ``Recorder`` and the resulting ``TopView`` replaces the last; a read that
fails keeps the data shown and says why (``TopView.problem``), and the next
second it tries again. ``run_screen`` is the loop: it repaints when a view
arrives, a key is pressed or the terminal is resized (``KEY_RESIZE``), waits
at most ``KEY_WAIT_MILLISECONDS`` for a key, and paints ``render``'s lines in
colour, or only bold, dim and reverse when ``$NO_COLOR`` is set
(https://no-color.org) or the terminal has no colours. Nothing but this module
imports ``curses`` (the daemon never does: tests/test_footprint.py).
"""

from __future__ import annotations

import contextlib
import curses
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace

from trainmon.doctor import MeasurementError
from trainmon.local_daemon import UntrustedDaemon
from trainmon.top.keys import apply_key
from trainmon.top.model import Recorder, TopView
from trainmon.top.profiles import Notice, ProfileFollower
from trainmon.top.render import Line, ScreenState, cells, render, selected_job
from trainmon.top.source import SnapshotSource

#: Seconds between two reads of the source.
REFRESH_SECONDS = 1.0
#: Longest wait for a key before the loop looks for a new view (milliseconds).
KEY_WAIT_MILLISECONDS = 100
#: curses key codes → the names ``keys.apply_key`` takes.
KEY_NAMES: Mapping[int, str] = {
    curses.KEY_UP: "up", curses.KEY_DOWN: "down", curses.KEY_LEFT: "left",
    curses.KEY_ENTER: "enter", curses.KEY_BACKSPACE: "backspace", curses.KEY_RESIZE: "resize",
}
CHARACTER_NAMES: Mapping[str, str] = {"\n": "enter", "\r": "enter", "\x1b": "esc",
                                      "\x7f": "backspace", "\b": "backspace"}


class TerminalError(Exception):
    """curses cannot drive the terminal."""


class Poller:
    """The source read every ``interval`` seconds in a thread; the latest view."""

    def __init__(self, source: SnapshotSource, recorder: Recorder,
                 interval: float = REFRESH_SECONDS) -> None:
        self._source = source
        self._recorder = recorder
        self._interval = interval
        self._lock = threading.Lock()
        self._view = TopView(source.name, None)
        self._version = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="top-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5.0)

    def latest(self) -> tuple[TopView, int]:
        """The newest view and its number (it grows with each view)."""
        with self._lock:
            return self._view, self._version

    def poll_once(self) -> TopView:
        """Read the source once and build the view."""
        problem = ""
        try:
            snapshot = self._source.read()
            if self._source.changed():
                self._recorder.reset()
            self._recorder.add(snapshot)
        except (MeasurementError, UntrustedDaemon) as error:
            problem = str(error)
        view = self._recorder.view(self._source.name, problem)
        with self._lock:
            self._view = view
            self._version += 1
        return view

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stopping.wait(max(0.0, self._interval - (time.monotonic() - started)))


def run_screen(poller: Poller, state: ScreenState, *, colors: bool,
               profiles: ProfileFollower | None = None) -> None:
    """The curses loop until a key quits; the terminal is restored however it ends.
    ``profiles`` answers ``p`` (None: the source is no daemon; ``p`` says so)."""
    # ncurses takes $LINES and $COLUMNS, where set, for the terminal's size, at the start
    # and at every resize: the screen would keep the size they say
    for name in ("LINES", "COLUMNS"):
        os.environ.pop(name, None)
    # curses.wrapper, but colours started only when wanted: start_color alone makes
    # curses write the default pair's colours
    try:
        screen = curses.initscr()
    except curses.error as error:  # a $TERM without a terminfo entry
        raise TerminalError(f"cannot drive this terminal ($TERM {os.environ.get('TERM')!r}): "
                            f"{error}") from None
    try:
        curses.noecho()
        curses.cbreak()
        screen.keypad(True)
        colors = colors and curses.has_colors()
        if colors:
            curses.start_color()
        _loop(screen, poller, state, colors, profiles)
    finally:
        screen.keypad(False)
        curses.echo()
        curses.nocbreak()
        curses.endwin()


def _loop(screen: curses.window, poller: Poller, state: ScreenState, colors: bool,
          profiles: ProfileFollower | None) -> None:
    with contextlib.suppress(curses.error):  # a terminal that cannot hide the cursor
        curses.curs_set(0)
    screen.timeout(KEY_WAIT_MILLISECONDS)
    attributes = _attributes(colors)
    painted = -1
    dirty = True
    while True:
        view, version = poller.latest()
        if state.ask_profile or profiles is not None:
            noticed = with_profile(state, view, profiles)
            dirty = dirty or noticed != state
            state = noticed
        if dirty or version != painted:
            _paint(screen, render(view, state, *_size(screen)), attributes)
            painted, dirty = version, False
        key = _read_key(screen)
        if key is None:
            continue
        if key == "resize":
            curses.update_lines_cols()
            # repaint every cell: the terminal may have reflowed what was there
            screen.clear()
            dirty = True
            continue
        changed = apply_key(state, key, view)
        if changed is None:
            return
        dirty = dirty or changed != state
        state = changed


def with_profile(state: ScreenState, view: TopView,
                 profiles: ProfileFollower | None) -> ScreenState:
    """``state`` with a profile asked for where ``p`` was pressed (of the job shown), and
    with the latest profile's notice."""
    notice = state.notice
    if state.ask_profile:
        job = selected_job(view, state)
        if profiles is None:
            notice = Notice("unavailable", {}, "warn")
        elif job is not None:
            profiles.start(job.job)
    if profiles is not None:
        notice = profiles.notice() or notice
    return replace(state, ask_profile=False, notice=notice)


def _size(screen: curses.window) -> tuple[int, int]:
    height, width = screen.getmaxyx()
    return width, height


def _read_key(screen: curses.window) -> str | None:
    try:
        key = screen.get_wch()
    except curses.error:
        return None  # no key within the wait
    if isinstance(key, int):
        return KEY_NAMES.get(key, "")
    return CHARACTER_NAMES.get(key, key)


def _paint(screen: curses.window, lines: list[Line],
           attributes: Mapping[str, int]) -> None:
    screen.erase()
    for row, line in enumerate(lines):
        column = 0
        for text, style in line:
            # the bottom-right cell: curses writes it, then fails to move the cursor
            with contextlib.suppress(curses.error):
                screen.addstr(row, column, text, attributes.get(style, 0))
            column += cells(text)
    screen.refresh()


def _attributes(colors: bool) -> dict[str, int]:
    """Each ``render.STYLES`` as curses attributes."""
    plain = {"title": curses.A_BOLD, "heading": curses.A_BOLD, "job": curses.A_BOLD,
             "selected": curses.A_REVERSE | curses.A_BOLD, "bad": curses.A_BOLD,
             "warn": curses.A_BOLD, "ok": 0, "dim": curses.A_DIM, "": 0}
    if not colors:
        return plain
    curses.use_default_colors()
    pairs: dict[str, int] = {}
    for number, (style, color) in enumerate(
            (("title", curses.COLOR_CYAN), ("ok", curses.COLOR_GREEN),
             ("warn", curses.COLOR_YELLOW), ("bad", curses.COLOR_RED)), start=1):
        curses.init_pair(number, color, -1)
        pairs[style] = curses.color_pair(number)
    return {style: attribute | pairs.get(style, 0) for style, attribute in plain.items()}
