"""``trainmon top``'s own words (and its profile notices'): each in English and Chinese, with the same placeholders,
and the column headings of both languages within their columns."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import pytest

from trainmon.top import profiles, words
from trainmon.top.render import COLUMNS, cells


def pairs() -> Iterator[tuple[str, tuple[str, str]]]:
    for module in (words, profiles):
        for name in sorted(vars(module)):
            value = getattr(module, name)
            if name.isupper() and isinstance(value, Mapping):
                yield from ((f"{name}.{key}", pair) for key, pair in value.items())
            elif name.isupper() and isinstance(value, tuple):
                yield name, value


@pytest.mark.parametrize(("name", "pair"), list(pairs()), ids=lambda item: str(item)[:40])
def test_each_word_has_both_languages_with_the_same_placeholders(
        name: str, pair: tuple[str, str]) -> None:
    english, chinese = pair
    assert english and chinese, name
    assert sorted(re.findall(r"\{(\w+)", english)) == sorted(re.findall(r"\{(\w+)", chinese))


def test_every_column_heading_fits_its_column_in_both_languages() -> None:
    for column in COLUMNS:
        assert all(cells(heading) <= column.cells for heading in column.heading), column.key
