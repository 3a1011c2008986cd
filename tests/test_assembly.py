"""Which collectors a reload keeps (trainmon.assembly): the real entries, built from
parsed configurations, never started."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmon.assembly import Assembly, assemble
from trainmon.cli import enabled_collectors
from trainmon.config import Config, parse_config


def config(tmp_path: Path, **sections: dict[str, object]) -> Config:
    collectors: dict[str, dict[str, object]] = {
        "gpu": {"enabled": False}, "tencent": {"enabled": False},
        "training": {"socket": str(tmp_path / "steps.sock")},
        "ledger": {"path": str(tmp_path / "ledger.sqlite3")},
    }
    for name, section in sections.items():
        collectors[name] = {**collectors.get(name, {}), **section}
    return parse_config({"collectors": collectors})


def build(chosen: Config, previous: Assembly | None = None) -> Assembly:
    return assemble(enabled_collectors(chosen, demo=False), chosen, demo=False,
                    previous=previous)


def by_name(assembly: Assembly) -> dict[str, object]:
    return {part.entry.name: part.collector for part in assembly.parts}


def test_an_unchanged_configuration_keeps_every_instance(tmp_path: Path) -> None:
    first = build(config(tmp_path))
    assert build(config(tmp_path), first).parts == first.parts


def test_a_changed_section_rebuilds_its_collector_and_those_built_with_it(
        tmp_path: Path) -> None:
    first = build(config(tmp_path, gpu={"enabled": True}))
    second = build(config(tmp_path, gpu={"enabled": True, "idle_threshold": 0.2}), first)
    before, after = by_name(first), by_name(second)
    rebuilt = sorted(name for name in after if after[name] is not before.get(name))
    # attribution and numa read the GPU collector's process lists: built anew with it
    assert rebuilt == ["attribution", "gpu", "numa"]
    # the ledger reads them too, and follows the new ones once they run; the training
    # collector reads its token file again at every reload
    assert after["ledger"] is before["ledger"] and len(second.followups) == 2
    third = build(config(tmp_path, gpu={"enabled": True, "idle_threshold": 0.2}), second)
    assert third.parts == second.parts and len(third.followups) == 1


def test_a_live_key_of_a_surviving_collector_keeps_its_instance(tmp_path: Path) -> None:
    first = build(config(tmp_path))
    tokens = tmp_path / "tokens"
    second = build(config(tmp_path, training={"token_file": str(tokens)}), first)
    assert by_name(second)["training"] is by_name(first)["training"]
    assert by_name(second)["ledger"] is by_name(first)["ledger"]


def test_the_surviving_collectors_pin_what_they_were_built_with(tmp_path: Path) -> None:
    without_gpu = build(config(tmp_path))
    assert without_gpu.pinned() == {"training", "ledger", "profiling"}
    # the ledger books GPU time with the GPU collector's process lists and attribution's
    # attributor: it follows them when they are rebuilt, but they may not come or go
    with_gpu = build(config(tmp_path, gpu={"enabled": True}))
    assert with_gpu.pinned() == {"training", "ledger", "profiling"}
    assert with_gpu.followed() == {"training", "gpu", "attribution"}
    off = build(config(tmp_path, ledger={"enabled": False}))
    assert off.pinned() == {"training"} and off.followed() == frozenset()


def test_a_surviving_collector_is_never_built_anew(tmp_path: Path) -> None:
    first = build(config(tmp_path))
    with pytest.raises(RuntimeError, match="the ledger collector would be built anew"):
        build(config(tmp_path, ledger={"flush_seconds": 5}), first)
