"""Each collector in one home: its module declares its section and its registry entry.

A collector is one module of ``trainmon/collectors/`` ending in ``ENTRY``, listed
once in ``trainmon.collectors.MODULES`` (the scrape order) and once in the
collector table of docs/metrics.md; the configuration is assembled from the
entries by ``trainmon.config``, which only the CLI imports.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import trainmon
from trainmon.collectors import MODULES, entries
from trainmon.core.entry import CollectorEntry
from trainmon.section import Section, read_section

PACKAGE = Path(trainmon.__file__).resolve().parent
METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
COLUMNS = ("collector", "module", "default", "derived", "requires", "metrics")


def documented_collectors() -> list[dict[str, str]]:
    """The rows of the table under ``## Collectors`` in docs/metrics.md."""
    text = METRICS_DOC.read_text(encoding="utf-8")
    section = text.split("\n## Collectors\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == len(COLUMNS):
            rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


def test_every_collector_module_is_listed_once_and_declares_its_entry() -> None:
    modules = sorted(
        path.stem for path in (PACKAGE / "collectors").glob("*.py") if path.stem != "__init__"
    )
    assert sorted(MODULES) == modules
    assert len(set(MODULES)) == len(MODULES)
    for entry, name in zip(entries(), MODULES, strict=True):
        assert isinstance(entry, CollectorEntry)
        assert entry.name == name
        assert dataclasses.is_dataclass(entry.section), name
        assert entry.section.__dataclass_params__.frozen, name  # type: ignore[attr-defined]
        assert "enabled" in {spec.name for spec in dataclasses.fields(entry.section)}, name
        assert set(entry.requires) <= set(MODULES[: MODULES.index(name)]), name


def test_the_scrape_order_keeps_the_derived_collectors_last_in_their_order() -> None:
    """Sources first; attribution and numa read the GPU collector; the diagnosis reads
    the families collected before it; the ledger records its verdicts; profiling
    writes beside and into the ledger, last."""
    derived = [entry.name for entry in entries() if entry.derived]
    assert derived == ["attribution", "numa", "pressure", "diagnosis", "health", "ledger",
                       "profiling"]
    assert list(MODULES[-len(derived):]) == derived
    assert [entry.name for entry in entries() if entry.real_only] == ["tencent"]


@pytest.mark.parametrize("entry", entries(), ids=lambda entry: entry.name)
def test_an_empty_section_reads_as_the_section_defaults(entry: CollectorEntry[object]) -> None:
    """The generic reader has an accessor for every field of every section."""
    path = f"collectors.{entry.name}"
    assert read_section(entry.section, Section({}, path, {})) == entry.section()


def test_every_entry_has_its_row_in_the_metrics_reference() -> None:
    rows = documented_collectors()
    assert [row["collector"] for row in rows] == [f"`{name}`" for name in MODULES]
    for entry, row in zip(entries(), rows, strict=True):
        enabled = getattr(entry.section(), "enabled")  # noqa: B009 - the section's own default
        default = {True: "on", False: "off", "auto": "auto"}[enabled]
        assert row["module"] == f"`collectors/{entry.name}.py`"
        assert row["default"].split(" ")[0] == default, entry.name
        assert (row["derived"] == "yes") is entry.derived, entry.name
        assert re.findall(r"`([a-z]+)`", row["requires"]) == list(entry.requires), entry.name
        anchor = re.search(r"\]\(#([a-z0-9-]+)\)", row["metrics"])
        assert anchor is not None, entry.name
        headings = re.findall(r"^#+ (.+)$", METRICS_DOC.read_text(encoding="utf-8"), re.M)
        anchors = {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
                   for heading in headings}
        assert anchor.group(1) in anchors, entry.name


def _imports_config(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            lines += [node.lineno for alias in node.names if alias.name == "trainmon.config"]
        elif isinstance(node, ast.ImportFrom) and (
            node.module == "trainmon.config"
            or (node.module == "trainmon" and any(a.name == "config" for a in node.names))
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_cli_imports_the_configuration_assembly() -> None:
    """Every section lives with its owner; ``trainmon.config`` only assembles them, for
    the wiring: the CLI, the collectors it builds from a configuration, and the reload
    that rebuilds them."""
    importers = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if _imports_config(path)
    )
    assert importers == ["trainmon/assembly.py", "trainmon/cli.py", "trainmon/reload.py"]
