"""``trainmon top`` in a real terminal (tmux) against ``trainmon serve --demo``: both
demo jobs with their verdicts, the hang and the straggler marked, sorting, a resize to
60×20, the daemon going away (top says so and keeps running) and ``q``."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator

import pytest

from testkit.daemon import Daemon, trainmon_command
from testkit.prometheus import require
from tests.top.top_support import TMUX, Tmux

pytestmark = pytest.mark.integration


@pytest.fixture
def tmux_sessions() -> Iterator[Callable[..., Tmux]]:
    started: list[Tmux] = []

    def start(command: list[str], width: int = 80, height: int = 24) -> Tmux:
        require(TMUX, "tmux")
        session = Tmux(command, width, height, env={
            "TERM": "xterm-256color", "NO_COLOR": "1",
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
    # the demo's loader hang (6-18 s after its start), held after it clears
    top.wait_for(lambda text: "HUNG loader" in text, "the demo's hang marked", timeout=30)
    # its straggler: demo-healthy's rank 3, slowest of the job
    top.wait_for(lambda text: re.search(r"^\s+3\s+7\s.*(slowest|STRAGGLER) ×1\.\d\d",
                                        text, re.MULTILINE) is not None,
                 "demo-healthy's rank 3 marked as its slowest")

    top.keys("s")
    top.wait_for(lambda text: "sort:step" in text, "the sort key on the keys line")

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
