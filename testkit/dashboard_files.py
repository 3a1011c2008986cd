"""Reading the committed dashboard JSON: dashboards, panels, queries and variables."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "dashboards"
VARIANTS = ("dcgm", "tencent-cloud")
KINDS = ("training", "node", "fleet", "goodput")
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Dashboard:
    variant: str
    kind: str
    path: Path
    model: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.variant}/{self.kind}"

    def panels(self) -> Iterator[dict[str, Any]]:
        """Every panel, rows and panels nested in collapsed rows included."""
        for panel in self.model.get("panels", []):
            yield panel
            yield from panel.get("panels", [])

    def data_panels(self) -> Iterator[dict[str, Any]]:
        return (panel for panel in self.panels() if panel.get("type") != "row")

    def variables(self) -> list[dict[str, Any]]:
        return list(self.model.get("templating", {}).get("list", []))


@dataclass(frozen=True)
class PanelQuery:
    dashboard: Dashboard
    panel_title: str
    ref_id: str
    expr: str
    instant: bool

    @property
    def where(self) -> str:
        return f"{self.dashboard.name} · {self.panel_title!r} · {self.ref_id}"


def load_dashboards() -> list[Dashboard]:
    """The committed dashboards of both variants (a missing file fails loudly)."""
    return [
        Dashboard(variant, kind, path, json.loads(path.read_text(encoding="utf-8")))
        for variant in VARIANTS
        for kind in KINDS
        for path in [DASHBOARDS / variant / f"{kind}.json"]
    ]


def annotation_queries(dashboard: Dashboard) -> list[PanelQuery]:
    """The Prometheus annotation queries (markers), as range queries named after them."""
    return [
        PanelQuery(dashboard, f"annotation {item.get('name', '')}", "annotation",
                   str(item["expr"]), False)
        for item in dashboard.model.get("annotations", {}).get("list", [])
        if item.get("expr")
    ]


def panel_queries(dashboard: Dashboard) -> list[PanelQuery]:
    return [
        PanelQuery(dashboard, panel.get("title", ""), target.get("refId", ""),
                   target.get("expr", ""), bool(target.get("instant")))
        for panel in dashboard.data_panels()
        for target in panel.get("targets", [])
    ]
