"""Dashboards as ``grafana-foundation-sdk`` builds them, with the bundle's conventions.

``Board`` is one dashboard under construction: it carries the ``$datasource``
variable, numbers every row and panel with a dashboard-unique id, lays panels
out with the SDK's grid placement (24 columns), holds its Prometheus
annotation queries (``PromAnnotation``: markers such as run starts) and renders
stable JSON; ``Board.panel_id`` finds a panel by its title, for links that open
one panel of another dashboard (``panel_url``). The
variable and link helpers here are shared by every dashboard; the panel
factories are in ``dashboards.panels``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Self, cast

from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    Panel,
    VariableModel,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.dashboard import DashboardLink as DashboardLinkModel

DATASOURCE_VARIABLE = "datasource"
#: The only datasource reference any panel, query or variable carries.
DATASOURCE = DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
#: Grafana's rate window that adapts to the datasource's scrape interval.
RATE = "$__rate_interval"

VariableBuilder = Builder[VariableModel]
LinkBuilder = Builder[DashboardLinkModel]


class PanelBuilder(Protocol):
    """What every SDK panel builder (timeseries, stat, table…) offers for placement."""

    def span(self, w: int) -> Self: ...

    def height(self, h: int) -> Self: ...

    def id(self, id_val: int) -> Self: ...

    def build(self) -> Panel: ...


def link(title: str, url: str, *, new_tab: bool = False) -> LinkBuilder:
    """A data link (on a field) or a dashboard link that opens ``url`` (in a new browser
    tab with ``new_tab``: a page outside Grafana, such as a runbook)."""
    builder = dashboard_builders.DashboardLink(title).type(DashboardLinkType.LINK).url(url)
    return builder.target_blank(True) if new_tab else builder


def dashboard_url(uid: str, **variables: str) -> str:
    """A link to another dashboard keeping the datasource and the time range.

    ``variables`` maps a variable name to its value, usually a field label such
    as ``${__field.labels.node}`` or ``${__data.fields.job}``.
    """
    params = "".join(f"&var-{name}={value}" for name, value in variables.items())
    return f"/d/{uid}?${{{DATASOURCE_VARIABLE}:queryparam}}&${{__url_time_range}}{params}"


def panel_url(uid: str, panel_id: int, **variables: str) -> str:
    """``dashboard_url`` opening one panel of that dashboard on its own (Grafana's
    ``viewPanel``); ``panel_id`` from ``Board.panel_id`` of the other dashboard."""
    return f"{dashboard_url(uid, **variables)}&viewPanel={panel_id}"


def datasource_variable() -> dashboard_builders.DatasourceVariable:
    """The ``$datasource`` picker every panel queries (Prometheus datasources only)."""
    return (
        dashboard_builders.DatasourceVariable(DATASOURCE_VARIABLE)
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus that scrapes trainmon (and dcgm-exporter).")
    )


def query_variable(
    name: str,
    label: str,
    query: str,
    description: str,
    *,
    multi: bool = False,
    numeric: bool = False,
) -> dashboard_builders.QueryVariable:
    """A ``label_values(...)`` variable; ``multi`` adds "All" (matching any value)."""
    variable = (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NUMERICAL_ASC if numeric
              else VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
    )
    if multi:
        variable = variable.multi(True).include_all(True).all_value(".+")
    return variable


@dataclass(frozen=True)
class PromAnnotation:
    """A Prometheus annotation query: one vertical marker per series, at its value.

    ``expr`` must return a timestamp in milliseconds (Grafana's "series value as
    timestamp"); ``title`` and ``text`` are templates over the series' labels
    (``{{run}}``), ``tags`` the label names shown as tags. The SDK's
    ``AnnotationQuery`` has no field for these Prometheus options, so the board
    writes the annotation's JSON itself.
    """

    name: str
    expr: str
    title: str
    text: str
    tags: Sequence[str]
    color: str = "blue"
    step: str = "1m"

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "datasource": {"type": DATASOURCE.type_val, "uid": DATASOURCE.uid},
            "enable": True,
            "hide": False,
            "iconColor": self.color,
            "builtIn": 0,
            "expr": self.expr,
            "step": self.step,
            "titleFormat": self.title,
            "textFormat": self.text,
            "tagKeys": ",".join(self.tags),
            "useValueForTime": True,
        }


class Board:
    """One dashboard being built: numbers its panels and renders the JSON.

    Panels are placed left to right, top to bottom (24 grid columns);
    ``row()`` starts a titled row. ``since`` is the start of the default time range.
    """

    def __init__(
        self,
        *,
        uid: str,
        title: str,
        description: str,
        tags: Sequence[str],
        links: Sequence[LinkBuilder],
        since: str = "now-1h",
    ) -> None:
        self._next_id = 1
        self._panel_ids: dict[str, int] = {}
        self._annotations: list[PromAnnotation] = []
        self._dashboard = (
            dashboard_builders.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags(list(tags))
            .editable()
            .tooltip(DashboardCursorSync.CROSSHAIR)
            .time(since, "now")
            .refresh("30s")
            .timezone("browser")
            .links(list(links))
            .with_variable(datasource_variable())
        )

    def variable(self, variable: VariableBuilder) -> Board:
        self._dashboard = self._dashboard.with_variable(variable)
        return self

    def row(self, title: str) -> Board:
        self._dashboard = self._dashboard.with_row(
            dashboard_builders.Row(title).id(self._take_id())
        )
        return self

    def add(self, panel: PanelBuilder, *, width: int = 12, height: int = 8) -> Board:
        """Place ``panel`` (any SDK panel builder) ``width`` of 24 columns wide."""
        placed = panel.span(width).height(height).id(self._take_id())
        built = placed.build()
        if built.title is not None and built.id_val is not None:
            self._panel_ids[built.title] = built.id_val
        # Every SDK panel builder subclasses Builder[Panel]; the protocol only adds placement.
        self._dashboard = self._dashboard.with_panel(cast(Builder[Panel], placed))
        return self

    def panel_id(self, title: str) -> int:
        """The id of the panel titled ``title`` (titles are unique within a dashboard);
        KeyError when there is none, so a renamed panel fails the build of a link to it."""
        if title not in self._panel_ids:
            raise KeyError(f"no panel titled {title!r} in {self._dashboard.build().uid}")
        return self._panel_ids[title]

    def annotation(self, annotation: PromAnnotation) -> Board:
        self._annotations.append(annotation)
        return self

    def to_json(self) -> str:
        """The dashboard as Grafana JSON (UTF-8 text, two-space indent, final newline)."""
        model = self._dashboard.build()
        if not self._annotations:
            return json.dumps(model, cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"
        document = json.loads(json.dumps(model, cls=JSONEncoder))
        document["annotations"] = {"list": [item.to_json() for item in self._annotations]}
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"

    def _take_id(self) -> int:
        panel_id = self._next_id
        self._next_id += 1
        return panel_id
