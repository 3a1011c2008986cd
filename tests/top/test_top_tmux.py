"""``trainmon top`` in a real terminal (tmux) against ``trainmon serve --demo``: both
demo jobs with their verdicts, the hang and the straggler marked, colour or ``NO_COLOR``,
sorting, a job's profile asked from its detail, a resize to 60×20, the daemon going away (top says so and keeps running) and
``q``; and a terminal curses cannot drive."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon, trainmon_command
from testkit.prometheus import require, wait_until
from tests.top.top_support import TMUX, Tmux

pytestmark = pytest.mark.integration
#: A colour in what tmux writes for the pane (SGR 30-37, 90-97 or 38;5;N foregrounds).
COLOR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-7]|9[0-7]|38;5;[0-9]+)(?:;[0-9;]*)?m")


@pytest.fixture
def tmux_sessions(tmp_path: Path) -> Iterator[Callable[..., Tmux]]:
    started: list[Tmux] = []

    def start(command: list[str], width: int = 80, height: int = 24,
              colors: bool = False) -> Tmux:
        require(TMUX, "tmux")
        socket = tmp_path / f"tmux-{len(started)}.sock"
        session = Tmux(command, width, height, socket, env={
            "TERM": "xterm-256color", **({} if colors else {"NO_COLOR": "1"}),
            **{name: os.environ[name] for name in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY")
               if name in os.environ}})
        started.append(session)
        return session

    yield start
    for session in started:
        session.close()


def widest(screen: str) -> int:
    return max((len(line.rstrip()) for line in screen.splitlines()), default=0)


def test_top_shows_the_demo_and_survives_resize_and_the_daemon_going_away(
        start_daemon: Callable[..., Daemon], tmux_sessions: Callable[..., Tmux]) -> None:
    daemon = start_daemon(args=["--demo"])
    top = tmux_sessions([*trainmon_command(), "top", "--url", daemon.url])

    screen = top.wait_for(lambda text: "demo-healthy  " in text and "demo-starved  " in text
                          and re.search(r"demo-starved  (STORAGE|SCHEDULING)", text)
                          is not None, "both demo jobs with their verdicts")
    assert re.search(r"demo-healthy  (COMPUTE|SCHEDULING|NONE)", screen), screen
    # NO_COLOR: bold, dim and reverse, no colour; without it, the verdicts in colour
    assert not COLOR.search(top.run("capture-pane", "-p", "-e", "-t", "top"))
    colored = tmux_sessions([*trainmon_command(), "top", "--url", daemon.url], colors=True)
    colored.wait_for(lambda text: "demo-starved  " in text, "the jobs in colour")
    assert COLOR.search(colored.run("capture-pane", "-p", "-e", "-t", "top"))
    colored.keys("q")
    colored.wait_closed("the coloured top to quit")
    # the demo's loader hang (6-18 s after its start), held after it clears
    top.wait_for(lambda text: "HUNG loader" in text, "the demo's hang marked", timeout=30)
    # its straggler: demo-healthy's rank 3, slowest of the job
    top.wait_for(lambda text: re.search(r"^\s+3\s+7\s.*(slowest|STRAGGLER) ×1\.\d\d",
                                        text, re.MULTILINE) is not None,
                 "demo-healthy's rank 3 marked as its slowest")

    top.keys("s")
    top.wait_for(lambda text: "sort:step" in text, "the sort key on the keys line")

    # a job's detail, and p: its profile is asked (the demo's simulated ranks never
    # answer, so the line above the keys follows the request under way)
    top.keys("Enter")
    top.wait_for(lambda text: "p profile" in text, "the detail view's keys")
    top.keys("p")
    top.wait_for(lambda text: re.search(r"profile of demo-\w+: \d+ step\(s\) of rank 0",
                                        text) is not None, "the profile under way")
    top.keys("Escape")
    top.wait_for(lambda text: "sort:step" in text, "the table again")

    top.resize(60, 20)
    narrow = ["RANK", "STEP", "SMP/S", "WAIT", "COMM", "UTIL", "FOUND"]
    screen = top.wait_for(lambda text: any(line.split() == narrow
                                           for line in text.splitlines()),
                          "the screen laid out again for 60×20")
    assert len(screen.splitlines()) <= 20 and widest(screen) <= 60, screen
    assert "demo-healthy" in screen and "sort:step" in screen.splitlines()[-1], screen

    daemon.stop()
    top.wait_for(lambda text: "cannot read it" in text and "demo-healthy" in text,
                 "top saying the daemon went away, the last data still shown")
    assert top.alive()
    top.keys("q")
    top.wait_closed("top to quit on q")


def test_a_terminal_that_curses_cannot_drive_is_named_and_exits_2(
        tmux_sessions: Callable[..., Tmux], tmp_path: Path) -> None:
    errors = tmp_path / "stderr"
    command = " ".join(shlex.quote(part) for part in trainmon_command())
    tmux_sessions(["sh", "-c", f"TERM=bogus-term {command} top --url 127.0.0.1:9 "
                               f"2>{errors}; echo exit $? >>{errors}"])
    text = wait_until(lambda: errors.exists() and "exit" in errors.read_text()
                      and errors.read_text(), 20, "top to fail on an unknown terminal")
    assert text == ("trainmon top: cannot drive this terminal ($TERM 'bogus-term'): setupterm: "
                    "could not find terminal\nexit 2\n")
