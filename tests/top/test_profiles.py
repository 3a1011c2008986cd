"""``p`` in ``trainmon top``'s detail view: the job shown is profiled on demand, on a
thread, and the screen shows the request's course and its top operators, or why not
(``trainmon.top.profiles``). The daemon's side is a stand-in client here;
tests/profiling/test_profile_job.py asks a real daemon about a real job."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from tests.top.top_support import demo_like, view
from trainmon.runs.profile import ProfileClient, ProfileRefused, ProfileUnreachable
from trainmon.top.keys import apply_key
from trainmon.top.profiles import Notice, ProfileFollower
from trainmon.top.render import ScreenState, cells, line_text, render
from trainmon.top.screen import with_profile

OPERATORS = [{"name": "aten::mm", "share": 0.41, "seconds": 0.041, "calls": 30},
             {"name": "aten::relu", "share": 0.12, "seconds": 0.012, "calls": 10}]


class StandIn(ProfileClient):
    """Answers as the daemon does: ``answers`` are the statuses the request goes
    through, the last one closed; ``refusal`` instead refuses the request."""

    def __init__(self, answers: list[dict[str, Any]] | None = None,
                 refusal: Exception | None = None) -> None:
        super().__init__("http://127.0.0.1:9")
        self.answers = list(answers or [])
        self.refusal = refusal
        self.asked: list[str] = []
        self.release = threading.Event()

    def ask(self, job: str, *, ranks: object = None, steps: object = None) -> dict[str, Any]:
        self.asked.append(job)
        if self.refusal is not None:
            raise self.refusal
        return {"id": "req-1", "open": True, "steps": 5, "ranks": [0]}

    def status(self, request_id: str) -> dict[str, Any]:
        self.release.wait(10)
        return self.answers.pop(0)


def closed(state: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": "req-1", "open": False, "ranks_state": {"0": dict(state)}}


def followed(client: StandIn, job: str = "healthy") -> Notice:
    follower = ProfileFollower(client, poll_seconds=0.0)
    assert follower.start(job)
    client.release.set()
    assert follower._thread is not None
    follower._thread.join(10)
    notice = follower.notice()
    assert notice is not None
    return notice


def test_a_profile_is_asked_followed_and_its_top_operators_shown() -> None:
    client = StandIn([{"id": "req-1", "open": True, "ranks_state": {"0": {"state": "pending"}}},
                      closed({"state": "stored", "top_cpu": OPERATORS, "top_device": []})])
    follower = ProfileFollower(client, poll_seconds=0.0)
    assert follower.start("healthy")
    assert not follower.start("starved")  # one at a time
    running = follower.notice()
    assert running is not None and running.style == "dim"
    client.release.set()
    assert follower._thread is not None
    follower._thread.join(10)
    notice = follower.notice()
    assert notice is not None and notice.style == "ok"
    assert notice.text("en") == ("profile of healthy rank 0 (CPU self time): "
                                 "aten::mm 41 %, aten::relu 12 %")
    assert notice.text("zh").startswith("healthy rank 0 的 profile（CPU 自身耗时）：aten::mm")
    assert client.asked == ["healthy"]
    client.answers.append(closed({"state": "stored", "top_cpu": OPERATORS, "top_device": []}))
    assert follower.start("starved")  # the first one ended
    follower._thread.join(10)
    assert client.asked == ["healthy", "starved"]


def test_gpu_time_is_shown_where_the_job_has_it() -> None:
    notice = followed(StandIn([closed({"state": "stored", "top_cpu": OPERATORS,
                                       "top_device": OPERATORS[1:]})]))
    assert notice.text("en") == "profile of healthy rank 0 (GPU self time): aten::relu 12 %"


@pytest.mark.parametrize(("client", "text"), [
    (StandIn(refusal=ProfileRefused(403, "job 'healthy' belongs to another user")),
     "profile of healthy: refused: job 'healthy' belongs to another user (HTTP 403)"),
    (StandIn(refusal=ProfileUnreachable("cannot ask http://127.0.0.1:9: refused")),
     "profile of healthy: cannot ask http://127.0.0.1:9: refused"),
    (StandIn([closed({"state": "expired"})]),
     "profile of healthy rank 0: never answered (does the job report over the unix "
     "socket, and does it still step?)"),
    (StandIn([closed({"state": "failed", "error": "a torch.profiler of the job's own "
                                                  "is running"})]),
     "profile of healthy rank 0: a torch.profiler of the job's own is running"),
], ids=["forbidden", "unreachable", "expired", "failed"])
def test_a_refused_or_failed_profile_says_why(client: StandIn, text: str) -> None:
    notice = followed(client)
    assert (notice.text("en"), notice.style) == (text, "bad")


def test_p_in_the_detail_view_profiles_the_job_shown_and_nowhere_else() -> None:
    shown = view(demo_like(), 14)
    listing = ScreenState(selected="starved")
    assert apply_key(listing, "p", shown) == listing  # the table: p does nothing
    detail = apply_key(listing, "enter", shown)
    assert detail is not None and detail.detail
    asked = apply_key(detail, "p", shown)
    assert asked is not None and asked.ask_profile

    client = StandIn([closed({"state": "stored", "top_cpu": OPERATORS, "top_device": []})])
    follower = ProfileFollower(client, poll_seconds=0.0)
    state = with_profile(asked, shown, follower)
    assert not state.ask_profile and client.asked == ["starved"]
    assert state.notice is not None and state.notice.key in ("asked", "running")
    # through Prometheus there is no daemon to ask: p says so
    state = with_profile(asked, shown, None)
    assert state.notice is not None and state.notice.key == "unavailable"
    client.release.set()
    follower.stop()


@pytest.mark.parametrize(("width", "height", "lang"), [(80, 24, "en"), (60, 20, "zh"),
                                                       (40, 10, "en")])
def test_the_notice_sits_above_the_keys_and_fits(width: int, height: int, lang: str) -> None:
    shown = view(demo_like(), 14)
    assert shown.wall is not None
    notice = Notice("stored", {"job": "starved", "rank": "0", "where": "cpu",
                               "operators": "aten::mm 41 %, aten::relu 12 %"}, "ok")
    for detail in (False, True):
        state = ScreenState(selected="starved", detail=detail, lang=lang, notice=notice)
        lines = [line_text(line) for line in render(shown, state, width, height,
                                                    now=shown.wall + 1)]
        assert len(lines) == height and all(cells(line) <= width for line in lines)
        assert lines[-2].startswith(notice.text(lang)[:12]), lines[-2]
    english = [line_text(line) for line in render(
        shown, ScreenState(selected="starved", detail=True), 80, 24, now=shown.wall + 1)]
    assert english[-1] == "↵/esc back  ↑↓ scroll  p profile  l 中文  q quit"
