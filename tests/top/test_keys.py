"""``trainmon top``'s keys: what each does to the screen's state (``keys.apply_key``)."""

from __future__ import annotations

from tests.top.top_support import demo_like, view
from trainmon.top.keys import apply_key
from trainmon.top.render import SORT_KEYS, ScreenState

VIEW = view(demo_like(), 6)


def press(state: ScreenState, *keys: str) -> ScreenState | None:
    current: ScreenState | None = state
    for key in keys:
        assert current is not None
        current = apply_key(current, key, VIEW)
    return current


def test_q_quits_from_the_table_and_the_detail_but_is_typed_into_a_filter() -> None:
    assert press(ScreenState(), "q") is None
    assert press(ScreenState(), "enter", "q") is None
    typed = press(ScreenState(), "/", "q")
    assert typed is not None and typed.typing == "q"


def test_s_goes_through_every_sort_key_and_r_reverses() -> None:
    state: ScreenState | None = ScreenState()
    seen = []
    for _ in SORT_KEYS:
        assert state is not None
        seen.append(state.sort)
        state = press(state, "s")
    assert seen == list(SORT_KEYS) and state is not None and state.sort == "rank"
    assert press(ScreenState(), "r") == ScreenState(reverse=True)


def test_arrows_choose_a_job_and_enter_opens_and_leaves_its_detail() -> None:
    state = press(ScreenState(), "down")
    assert state is not None and state.selected == "starved"
    assert press(state, "down") == state  # the last job stays selected
    detail = press(state, "enter")
    assert detail == ScreenState(selected="starved", detail=True)
    assert press(detail, "down", "down", "up") == ScreenState(selected="starved", detail=True,
                                                             scroll=1)
    assert press(detail, "esc") == ScreenState(selected="starved")


def test_slash_types_a_filter_that_enter_applies_and_esc_clears() -> None:
    assert press(ScreenState(), "/", "s", "t", "x", "backspace", "enter") == ScreenState(
        filter="st")
    assert press(ScreenState(filter="st"), "/", "esc") == ScreenState()


def test_l_and_m_toggle_the_language_and_the_marked_ranks() -> None:
    assert press(ScreenState(), "l") == ScreenState(lang="zh")
    assert press(ScreenState(), "l", "l", "m") == ScreenState(marked_only=True)
