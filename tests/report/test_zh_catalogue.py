"""Every text of ``doctor``'s catalogue exists in Chinese, and no Chinese text carries an
English sentence (``--lang zh`` leaves nothing in English but names, units and commands)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import pytest

from trainmon.report import messages

#: Entries whose Chinese is rightly their English: a heading of a name, a label value.
SAME_IN_BOTH = {("HEADINGS", "gpu"), ("WORDS", "rdma_active")}


def catalogue() -> Iterator[tuple[str, str, tuple[str, str]]]:
    """(catalogue, key, (English, Chinese)) of every entry of every catalogue in
    ``messages``, the single pairs (notes added to a finding) under the key ``""``."""
    for name in sorted(vars(messages)):
        value = getattr(messages, name)
        if not name.isupper():
            continue
        if isinstance(value, Mapping):
            for key, pair in value.items():
                if isinstance(pair, tuple) and len(pair) == 2:
                    yield name, str(key), pair
        elif (isinstance(value, tuple) and len(value) == 2
              and all(isinstance(text, str) for text in value)):
            yield name, "", value


def english_sentences(text: str) -> list[str]:
    """Runs of four or more English words, placeholders and code spans left out."""
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"`[^`]*`", "", text)
    return re.findall(r"[A-Za-z]{2,}(?:[ ,]+[A-Za-z]{2,}){3,}", text)


ENTRIES = list(catalogue())


def test_the_catalogue_is_read_whole() -> None:
    names = {name for name, _, _ in ENTRIES}
    assert {"HEADINGS", "WORDS", "FINDINGS", "ADVICE", "HISTORY", "REASONS", "END_WORDS",
            "AGO", "NCCL_PROBLEMS", "RECLAIM_NOTE"} <= names
    assert len(ENTRIES) > 150


@pytest.mark.parametrize(("name", "key", "pair"), ENTRIES,
                         ids=[f"{name}.{key}" for name, key, _ in ENTRIES])
def test_each_text_has_its_chinese_without_an_english_sentence(
        name: str, key: str, pair: tuple[str, str]) -> None:
    english, chinese = pair
    assert english and chinese
    if (name, key) not in SAME_IN_BOTH:
        assert chinese != english
    assert english_sentences(chinese) == []
    # the same values fill both (English alone makes a noun plural)
    assert placeholders(english) == placeholders(chinese)


def placeholders(text: str) -> set[str]:
    return {name for name in re.findall(r"\{(\w+)", text) if not name.endswith("_plural")}


def test_the_check_finds_an_english_sentence() -> None:
    assert english_sentences("无法测量：no GPU and no training job seen") == [
        "no GPU and no training job seen"]
    assert english_sentences("用 `with reporter.checkpoint(path): torch.save(...)` 上报") == []
