"""Which collectors a reload keeps (trainmon.assembly): the real entries, built from
parsed configurations, never started."""

from __future__ import annotations

from pathlib import Path

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
    # attribution and numa read the GPU collector's process lists; so does the ledger
    assert {"gpu", "attribution", "numa", "ledger"} <= set(rebuilt)
    assert "disk" not in rebuilt and "training" not in rebuilt


def test_the_surviving_collectors_pin_what_they_were_built_with(tmp_path: Path) -> None:
    without_gpu = build(config(tmp_path))
    assert without_gpu.pinned() == {"training", "ledger"}
    with_gpu = build(config(tmp_path, gpu={"enabled": True}))
    # the ledger holds the GPU collector's process lists and attribution's attributor
    assert with_gpu.pinned() == {"training", "ledger", "gpu", "attribution"}
    off = build(config(tmp_path, ledger={"enabled": False}))
    assert off.pinned() == {"training"}
